#include "multiproc/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
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

static size_t Count(const std::string& hay, const std::string& needle) {
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

int FreeTcpPort() {
  // The kernel may hand the same free port out twice in a row; a test that asks for two
  // endpoints needs two ports, so none is given out twice by this process.
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0; attempt < 64; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
      port = ntohs(sa.sin_port);
    }
    close(fd);
    if (port != 0 && given.insert(port).second) return port;
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

std::string MakeTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/dlrun-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace dlrun::testing
