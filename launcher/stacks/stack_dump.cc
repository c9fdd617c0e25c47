// Dumping this node's workers (stacks.h): one py-spy or eu-stack process per worker, all at
// once, read through pipes with poll() until they finish or the bound passes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/contract.h"
#include "launcher/stacks/stacks.h"

extern char** environ;

namespace dlrun::launcher {
namespace {

bool Executable(const std::string& p) { return !p.empty() && access(p.c_str(), X_OK) == 0; }

std::string OnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    std::string p = absl::StrCat(dir, "/", name);
    if (Executable(p)) return p;
  }
  return "";
}

std::string ReadProc(pid_t pid, const char* what) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/", what), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The state letter of /proc/PID/stat (R, S, D, T, Z...), or 0 when the process is gone.
char ProcState(pid_t pid) {
  const std::string stat = ReadProc(pid, "stat");
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? 0 : stat[close + 2];
}

// The worker's interpreter as it was started (argv[0] of /proc/PID/cmdline, made absolute),
// for the py-spy of its own environment (a venv's bin/ has it next to python).
std::string PySpyNextToInterpreter(pid_t pid) {
  const std::string cmdline = ReadProc(pid, "cmdline");
  std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
  if (argv0.find('/') == std::string::npos) return "";
  std::error_code ec;
  if (argv0[0] != '/') {
    argv0 = (std::filesystem::read_symlink(absl::StrCat("/proc/", pid, "/cwd"), ec) / argv0);
    if (ec) return "";
  }
  const std::string p = std::filesystem::path(argv0).parent_path() / "py-spy";
  return Executable(p) ? p : "";
}

struct Job {
  RankStack* out = nullptr;
  pid_t tool_pid = -1;
  int fd = -1;
  std::string text;
  bool stopped_before = false;  // the worker was stopped (SIGSTOP) before the dump
  std::chrono::steady_clock::time_point started;
  double ran_ms = 0;
  int status = 0;
  bool finished = false;
};

bool Spawn(const std::vector<std::string>& argv, Job* job) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_adddup2(&fa, p[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The agent blocks the signals it reads from its signalfd: the tool gets a clean mask.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawn(&job->tool_pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(p[1]);
  if (rc != 0) {
    close(p[0]);
    job->out->missing = absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc));
    return false;
  }
  job->fd = p[0];
  fcntl(job->fd, F_SETFL, O_NONBLOCK);
  job->started = std::chrono::steady_clock::now();
  return true;
}

// The last non-empty line of a tool's output, for the reason a rank is missing.
std::string LastWords(const std::string& text) {
  std::string last;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    l = absl::StripAsciiWhitespace(l);
    if (!l.empty()) last = std::string(l);
  }
  return last.substr(0, 200);
}

}  // namespace

StackTools FindStackTools() {
  StackTools t;
  const char* py = std::getenv(contract::kPySpy);
  t.py_spy = py && *py ? py : "";
  const char* eu = std::getenv(contract::kEuStack);
  t.eu_stack = eu && *eu ? eu : OnPath("eu-stack");
  return t;
}

std::vector<RankStack> DumpStacks(const std::vector<DumpTarget>& targets, const StackTools& tools,
                                  const std::string& host, std::chrono::milliseconds bound) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + bound;
  std::vector<RankStack> out(targets.size());
  std::vector<Job> jobs(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const DumpTarget& t = targets[i];
    RankStack& r = out[i];
    r.rank = t.rank;
    r.local_rank = t.local_rank;
    r.pid = t.pid;
    r.host = host;
    jobs[i].out = &r;
    const char state = ProcState(t.pid);
    if (state == 0 || state == 'Z' || state == 'X') {
      r.missing = state == 0 ? "exited (no such process)" : "exited (a zombie)";
      continue;
    }
    jobs[i].stopped_before = state == 'T' || state == 't';
    std::error_code ec;
    const std::string exe =
        std::filesystem::read_symlink(absl::StrCat("/proc/", t.pid, "/exe"), ec).filename();
    std::vector<std::string> argv;
    if (absl::StartsWith(exe, "python")) {
      r.tool = "py-spy";
      std::string py_spy = tools.py_spy;
      if (py_spy.empty()) py_spy = PySpyNextToInterpreter(t.pid);
      if (py_spy.empty()) py_spy = OnPath("py-spy");
      if (py_spy.empty()) {
        r.missing = "a Python worker, and no py-spy next to its interpreter or on PATH "
                    "(pip install py-spy, or set " + std::string(contract::kPySpy) + ")";
        continue;
      }
      argv = {py_spy, "dump", "--nonblocking", "--json", "--pid", absl::StrCat(t.pid)};
    } else {
      r.tool = "eu-stack";
      if (tools.eu_stack.empty()) {
        r.missing = absl::StrCat("a native worker, and no eu-stack on PATH (Debian's elfutils, or set ",
                                 contract::kEuStack, ")");
        continue;
      }
      argv = {tools.eu_stack, "-s", "-m", "-p", absl::StrCat(t.pid)};
    }
    if (state == 'D') r.missing = "in uninterruptible sleep (D state)";  // replaced if read
    Spawn(argv, &jobs[i]);
  }

  // Read every tool's output as it comes, until each has closed its pipe or the bound passes.
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Job*> by_fd;
    for (Job& j : jobs) {
      if (j.fd < 0) continue;
      fds.push_back({j.fd, POLLIN, 0});
      by_fd.push_back(&j);
    }
    if (fds.empty()) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    if (poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Job& j = *by_fd[k];
      char buf[65536];
      for (;;) {
        const ssize_t n = read(j.fd, buf, sizeof buf);
        if (n > 0) {
          if (j.text.size() < (8u << 20)) j.text.append(buf, static_cast<size_t>(n));
          continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          close(j.fd);
          j.fd = -1;
          j.finished = true;
          j.ran_ms = std::chrono::duration<double, std::milli>(Clock::now() - j.started).count();
        }
        break;
      }
    }
  }
  // Past the bound: the tools still running are killed, and a worker an eu-stack may have left
  // stopped is continued (unless it was stopped before).
  for (Job& j : jobs) {
    if (j.tool_pid < 0) continue;
    if (!j.finished) {
      kill(j.tool_pid, SIGKILL);
      if (j.fd >= 0) close(j.fd);
      j.fd = -1;
    }
    int status = 0;
    if (waitpid(j.tool_pid, &status, 0) == j.tool_pid) j.status = status;
    if (!j.finished && j.out->tool == "eu-stack" && !j.stopped_before) kill(j.out->pid, SIGCONT);
  }

  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    RankStack& r = out[i];
    if (j.tool_pid < 0) continue;
    if (!j.finished) {
      r.missing = absl::StrCat(r.missing.empty() ? "" : r.missing + ": ", r.tool,
                               " did not finish within ", bound.count(), " ms");
      r.pause_ms = r.tool == "eu-stack" ? static_cast<double>(bound.count()) : 0;
      continue;
    }
    r.pause_ms = r.tool == "eu-stack" ? j.ran_ms : 0;
    if (r.tool == "py-spy") {
      auto threads = ParsePySpyJson(j.text, r.pid);
      if (threads.ok() && !threads->empty()) {
        r.threads = *std::move(threads);
        r.missing.clear();
      } else {
        r.missing = absl::StrCat("py-spy: ", LastWords(j.text));
      }
    } else {
      r.threads = ParseEuStack(j.text, r.pid);
      if (!r.threads.empty() && !r.threads.front().frames.empty()) {
        r.missing.clear();
      } else {
        r.threads.clear();
        r.missing = absl::StrCat("eu-stack: ", LastWords(j.text));
      }
    }
    if (!r.missing.empty() && ProcState(r.pid) == 0) r.missing = "exited during the dump";
  }
  return out;
}

}  // namespace dlrun::launcher
