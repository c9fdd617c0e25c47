#include "multiproc/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

namespace dlrun::testing {

Started StartCommand(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  Started s;
  s.pid = pid;
  s.out_fd = fds[0];
  return s;
}

size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

bool ReadUntil(Started& s, const std::string& needle, int count,
               std::chrono::milliseconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  char buf[4096];
  while (Count(s.output, needle) < static_cast<size_t>(count)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    end - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return false;
    pollfd p{s.out_fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    ssize_t n = read(s.out_fd, buf, sizeof buf);
    if (n <= 0) return Count(s.output, needle) >= static_cast<size_t>(count);
    s.output.append(buf, static_cast<size_t>(n));
  }
  return true;
}

int FinishCommand(Started& s, std::chrono::milliseconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    end - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      s.timed_out = true;
      kill(-s.pid, SIGKILL);
      break;
    }
    pollfd p{s.out_fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    ssize_t n = read(s.out_fd, buf, sizeof buf);
    if (n <= 0) break;  // EOF: every writer (the command and its children) is gone
    s.output.append(buf, static_cast<size_t>(n));
  }
  close(s.out_fd);
  int status = 0;
  waitpid(s.pid, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

bool WaitForExit(int pid, std::chrono::milliseconds deadline) {
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;  // already gone
  pollfd p{fd, POLLIN, 0};
  const bool exited = poll(&p, 1, static_cast<int>(deadline.count())) == 1;
  close(fd);
  return exited;
}

namespace {

bool CanBindLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

// The lowest port of the kernel's ephemeral range (what bind to port 0 and outgoing
// connections take), 32768 when it cannot be read.
int EphemeralLow() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return f >> low && low > 20000 ? low : 32768;
}

}  // namespace

int FreeTcpPort() {
  // A port from the kernel's ephemeral range can be taken between this call and the test's
  // bind by any process's outgoing connection or bind to port 0 (a parallel test's workers,
  // gRPC clients): ports are chosen below that range instead, at random, and each is locked
  // (flock on a file per port, held until this process exits) so that parallel test
  // processes never hand out the same one. None is given out twice by this process.
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard<std::mutex> lock(mu);
  const int low = 15000;
  const int high = EphemeralLow() - 1;
  const std::string dir = "/tmp/dlrun-test-ports";
  mkdir(dir.c_str(), 01777);
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> pick(low, high);
  for (int attempt = 0; attempt < 256; ++attempt) {
    const int port = pick(rng);
    if (given.count(port)) continue;
    const std::string path = dir + "/" + std::to_string(port);
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      continue;
    }
    if (!CanBindLoopback(port)) {
      close(fd);
      continue;
    }
    given.insert(port);  // fd stays open: the lock lasts as long as this process
    return port;
  }
  return 0;
}

ProcResult RunCommand(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env,
                      std::chrono::milliseconds deadline) {
  Started s = StartCommand(argv, env);
  ProcResult r;
  r.exit_code = FinishCommand(s, deadline);
  r.timed_out = s.timed_out;
  r.output = std::move(s.output);
  return r;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace dlrun::testing
