#include "launcher/workers/fork_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/contract.h"

namespace dlrun::launcher {
namespace {

// How long one fork may take to be answered: two forks of an interpreter that holds torch
// (~20 ms on an idle node) and the hand-over to the agent, on a node as busy as it gets.
constexpr Millis kForkBound{10000};

int LeftMs(SteadyTime deadline) {
  if (deadline == SteadyTime::max()) return -1;
  const auto left = std::chrono::duration_cast<Millis>(deadline - SystemClock().Now()).count();
  return static_cast<int>(std::max<int64_t>(0, left));
}

// One message from the server within `deadline` (empty: none, or its end of the socket closed).
std::string Receive(int sock, SteadyTime deadline, int interrupt_fd, bool* interrupted,
                    bool* timed_out = nullptr) {
  for (;;) {
    pollfd p[2] = {{sock, POLLIN, 0}, {interrupt_fd, POLLIN, 0}};
    const int r = poll(p, interrupt_fd >= 0 ? 2 : 1, LeftMs(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && timed_out != nullptr) *timed_out = true;
    if (r <= 0) return "";
    if (interrupt_fd >= 0 && (p[1].revents & POLLIN)) {
      *interrupted = true;
      return "";
    }
    char buf[256];
    const ssize_t n = recv(sock, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
}

}  // namespace

void EnterChildOfAgent(pid_t agent_pid) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != agent_pid) _exit(128 + SIGKILL);
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  signal(SIGPIPE, SIG_DFL);
}

std::unique_ptr<ForkServer> ForkServer::Start(const std::vector<std::string>& argv,
                                              const std::vector<std::string>& env) {
  // Its forks are orphaned on purpose (the middle process exits): they must come to the agent.
  if (argv.empty() || prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return nullptr;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
  // The environment of the worker it is started for, less that worker's own fds.
  std::vector<std::string> env_strings = env;
  std::erase_if(env_strings, [](const std::string& kv) {
    for (const char* name : {contract::kHeartbeatFd, contract::kControlFd, contract::kSpareFd}) {
      if (kv.rfind(absl::StrCat(name, "="), 0) == 0) return true;
    }
    return false;
  });
  env_strings.push_back(absl::StrCat(contract::kForkServerFd, "=", sv[1]));
  std::vector<char*> envp, args;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  const pid_t agent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return nullptr;
  }
  if (pid == 0) {  // async-signal-safe calls only, as for a worker (posix_processes.cc)
    EnterChildOfAgent(agent);
    dup2(STDERR_FILENO, STDOUT_FILENO);
    fcntl(sv[1], F_SETFD, 0);
    execvpe(args[0], args.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(sv[1]);
  return std::unique_ptr<ForkServer>(new ForkServer(pid, sv[0], argv));
}

ForkServer::~ForkServer() {
  close(sock_);
  if (!gone()) kill(-pid_, SIGKILL);
}

bool ForkServer::AwaitReady(SteadyTime deadline, int interrupt_fd,
                            const std::function<void()>& beat, Millis every) {
  if (state_ != State::kImporting) return ready();
  bool interrupted = false;
  std::string said;
  for (;;) {
    const SteadyTime now = std::chrono::steady_clock::now();
    const SteadyTime slice = beat && deadline - now > every ? now + every : deadline;
    bool timed_out = false;
    said = Receive(sock_, slice, interrupt_fd, &interrupted, &timed_out);
    if (!timed_out || slice == deadline) break;
    beat();  // still importing: the agent's heartbeat goes on meanwhile
  }
  if (said == "ready") {
    state_ = State::kReady;
  } else if (!interrupted) {
    state_ =
        State::kGone;  // its imports failed, it died, or they took longer than any worker's would
    kill(-pid_, SIGKILL);
  }
  return ready();
}

ForkServer::Request ForkServer::WorkerRequest(int out, int err, int heartbeat, int control,
                                              int spare, std::vector<std::string> env,
                                              std::vector<int> cpus) {
  Request r;
  r.spare = spare >= 0;
  r.env = std::move(env);
  r.cpus = std::move(cpus);
  r.fds = {{out, STDOUT_FILENO}, {err, STDERR_FILENO}, {heartbeat, heartbeat}, {control, control}};
  if (r.spare) r.fds.emplace_back(spare, spare);  // last: the spare reads it there
  return r;
}

absl::StatusOr<pid_t> ForkServer::Fork(const Request& r) {
  if (!ready()) return absl::UnavailableError("the fork server is not ready");
  std::vector<std::string> fields = {r.spare ? "S" : "W"};
  fields.push_back(absl::StrJoin(r.cpus, ","));
  std::vector<int> fds, targets;
  for (const auto& [fd, target] : r.fds) {
    fds.push_back(fd);
    targets.push_back(target);
  }
  fields.push_back(absl::StrJoin(targets, ","));
  fields.insert(fields.end(), r.env.begin(), r.env.end());
  const std::string msg = absl::StrJoin(fields, std::string(1, '\0'));
  iovec iov{const_cast<char*>(msg.data()), msg.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control.data();
  mh.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t n;
  do {
    n = sendmsg(sock_, &mh, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(msg.size())) {
    state_ = State::kGone;
    return absl::UnavailableError(absl::StrCat("the fork server: ", std::strerror(errno)));
  }
  bool interrupted = false;
  const std::string said = Receive(sock_, SystemClock().Now() + kForkBound, -1, &interrupted);
  int pid = 0;
  if (said.rfind("pid ", 0) == 0 && absl::SimpleAtoi(said.substr(4), &pid) && pid > 0) return pid;
  if (said.empty()) {  // no answer: it is stuck or gone, and no later fork would be answered
    state_ = State::kGone;
    kill(-pid_, SIGKILL);
  }
  return absl::UnavailableError(
      absl::StrCat("the fork server: ", said.empty() ? "no answer" : said));
}

}  // namespace dlrun::launcher
