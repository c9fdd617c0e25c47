#include "launcher/workers/worker_pipes.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "launcher/workers/fork_server.h"

extern char** environ;

namespace dlrun::launcher {
namespace {

// A pseudo-terminal for a worker's stdout: [0] the agent's end, [1] the worker's. The size is
// the agent's terminal's (progress bars fit); no \n -> \r\n translation (the agent adds the
// rank prefix to bytes as written). POSIX's calls, not openpty(), which glibc before 2.34 keeps
// in libutil (the wheel's dlrun needs the C library alone, on glibc 2.28: docs/PACKAGING.md).
bool OpenPty(int fds[2]) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return false;
  char name[128];
  if (grantpt(master) != 0 || unlockpt(master) != 0 || ptsname_r(master, name, sizeof name) != 0) {
    close(master);
    return false;
  }
  const int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) {
    close(master);
    return false;
  }
  fds[0] = master;
  fds[1] = slave;
  struct winsize ws {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) ioctl(slave, TIOCSWINSZ, &ws);
  struct termios t;
  if (tcgetattr(fds[1], &t) == 0) {
    t.c_oflag &= ~static_cast<tcflag_t>(ONLCR);
    tcsetattr(fds[1], TCSANOW, &t);
  }
  return true;
}

}  // namespace

absl::Status WorkerPipes::Open(bool pty, bool spare_fd) {
  if (pty ? !OpenPty(out) : pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(std::strerror(errno));
  }
  if (pipe2(err, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  if (pipe2(heartbeat, O_CLOEXEC | O_NONBLOCK) != 0)
    return absl::InternalError(std::strerror(errno));
  if (pipe2(control, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  if (spare_fd && pipe2(spare, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  return absl::OkStatus();
}

std::vector<std::string> MergedEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string_view::npos && overrides.count(std::string(kv.substr(0, eq)))) continue;
    out.emplace_back(kv);
  }
  for (const auto& [k, v] : overrides) out.push_back(k + "=" + v);
  return out;
}

[[noreturn]] void ExecChild(pid_t agent_pid, int out_w, int err_w, int hb_w, int ctl_r, int spare_r,
                            const cpu_set_t* cpus, char** argv, char** envp,
                            const std::string& failure) {
  EnterChildOfAgent(agent_pid);
  dup2(out_w, STDOUT_FILENO);
  dup2(err_w, STDERR_FILENO);
  fcntl(hb_w, F_SETFD, 0);                                  // the heartbeat pipe survives exec
  fcntl(hb_w, F_SETFL, fcntl(hb_w, F_GETFL) | O_NONBLOCK);  // a full pipe never blocks a worker
  fcntl(ctl_r, F_SETFD, 0);  // the agent's words (in-process recovery) survive exec too
  if (spare_r >= 0) fcntl(spare_r, F_SETFD, 0);  // a spare reads its environment here
  if (cpus != nullptr) sched_setaffinity(0, sizeof *cpus, cpus);
  execvpe(argv[0], argv, envp);
  const std::string msg = absl::StrCat(failure, std::strerror(errno), "\n");
  (void)!write(STDERR_FILENO, msg.data(), msg.size());
  _exit(127);
}

}  // namespace dlrun::launcher
