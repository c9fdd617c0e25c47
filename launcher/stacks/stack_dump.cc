// Dumping this node's workers (stacks.h): one py-spy or eu-stack process per worker, all at
// once, read through pipes with poll() until they finish or the bound passes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/contract.h"
#include "launcher/base/spawn_tool.h"
#include "launcher/stacks/stacks.h"

extern char** environ;

namespace dlrun::launcher {
namespace {

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

// The py-spy next to the worker's interpreter (InterpreterOf), or empty.
std::string PySpyNextToInterpreter(pid_t pid) {
  const std::string python = InterpreterOf(pid);
  if (python.find('/') == std::string::npos) return "";  // a bare name: PATH's
  const std::string p = std::filesystem::path(python).parent_path() / "py-spy";
  return Executable(p) ? p : "";
}

// One tool process of a RunTools batch.
struct ToolRun {
  std::vector<std::string> argv;  // empty: nothing to run
  pid_t pid = -1;
  int fd = -1;
  std::string text;  // stdout and stderr together
  std::string spawn_error;
  std::chrono::steady_clock::time_point started;
  double ran_ms = 0;
  bool finished = false;
};

void Spawn(ToolRun* job) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    job->spawn_error = std::strerror(errno);
    return;
  }
  ToolSpawn spawn;
  spawn.argv = job->argv;
  spawn.stdout_fd = spawn.stderr_fd = p[1];
  auto pid = SpawnTool(spawn);
  close(p[1]);
  if (!pid.ok()) {
    close(p[0]);
    job->pid = -1;
    job->spawn_error = std::string(pid.status().message());
    return;
  }
  job->pid = *pid;
  job->fd = p[0];
  fcntl(job->fd, F_SETFL, O_NONBLOCK);
  job->started = std::chrono::steady_clock::now();
}

// Runs every job's argv at once and reads their output until each has closed its pipe or
// `deadline` passes; the ones still running then are killed (finished stays false). Reaps them
// all.
void RunTools(std::vector<ToolRun>* jobs, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  for (ToolRun& j : *jobs) {
    if (!j.argv.empty()) Spawn(&j);
  }
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<ToolRun*> by_fd;
    for (ToolRun& j : *jobs) {
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
      ToolRun& j = *by_fd[k];
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
  for (ToolRun& j : *jobs) {
    if (j.pid < 0) continue;
    if (!j.finished) {
      kill(j.pid, SIGKILL);
      if (j.fd >= 0) close(j.fd);
      j.fd = -1;
    }
    int status = 0;
    waitpid(j.pid, &status, 0);  // ECHILD if another thread reaped it: nothing lost
  }
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

// What a finished (or killed) tool left: the rank's threads, or why they are missing.
void ReadToolRun(const ToolRun& j, bool stopped_before, std::chrono::milliseconds bound,
                 RankStack* r) {
  if (!j.spawn_error.empty()) {
    r->missing = j.spawn_error;
    return;
  }
  if (!j.finished) {
    // A worker an eu-stack was attached to when it was killed is continued (unless it was
    // stopped before).
    if (r->tool == "eu-stack" && !stopped_before) kill(r->pid, SIGCONT);
    r->missing = absl::StrCat(r->missing.empty() ? "" : r->missing + ": ", r->tool,
                             " did not finish within ", bound.count(), " ms");
    r->pause_ms = r->tool == "eu-stack" ? static_cast<double>(bound.count()) : 0;
    return;
  }
  r->pause_ms = r->tool == "eu-stack" ? j.ran_ms : 0;
  if (r->tool == "py-spy") {
    auto threads = ParsePySpyJson(j.text, r->pid);
    if (threads.ok() && !threads->empty()) {
      r->threads = *std::move(threads);
      r->missing.clear();
    } else {
      r->missing = absl::StrCat("py-spy: ", LastWords(j.text));
    }
  } else {
    r->threads = ParseEuStack(j.text, r->pid);
    if (!r->threads.empty() && !r->threads.front().frames.empty()) {
      r->missing.clear();
    } else {
      r->threads.clear();
      r->missing = absl::StrCat("eu-stack: ", LastWords(j.text));
    }
  }
  if (!r->missing.empty() && ProcState(r->pid) == 0) r->missing = "exited during the dump";
}

}  // namespace

bool Executable(const std::string& p) { return !p.empty() && access(p.c_str(), X_OK) == 0; }

std::string InterpreterOf(pid_t pid) {
  const std::string cmdline = ReadProc(pid, "cmdline");
  std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
  if (argv0.find('/') == std::string::npos) return argv0;
  if (argv0[0] != '/') {
    std::error_code ec;
    argv0 = (std::filesystem::read_symlink(absl::StrCat("/proc/", pid, "/cwd"), ec) / argv0);
    if (ec) return "";
  }
  return argv0;
}

std::string OnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    std::string p = absl::StrCat(dir, "/", name);
    if (Executable(p)) return p;
  }
  return "";
}

StackTools FindStackTools() {
  StackTools t;
  const char* py = std::getenv(contract::kPySpy);
  t.py_spy = py && *py ? py : "";
  const char* eu = std::getenv(contract::kEuStack);
  t.eu_stack = eu && *eu ? eu : OnPath("eu-stack");
  // elfutils' own, beside eu-stack.
  const std::string beside =
      std::filesystem::path(t.eu_stack).parent_path() / "eu-addr2line";
  t.eu_addr2line = !t.eu_stack.empty() && Executable(beside) ? beside : OnPath("eu-addr2line");
  return t;
}

std::vector<RankStack> DumpStacks(const std::vector<DumpTarget>& targets, const StackTools& tools,
                                  const std::string& host, std::chrono::milliseconds bound,
                                  bool symbolize) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RankStack> out(targets.size());
  std::vector<ToolRun> jobs(targets.size());
  std::vector<bool> stopped_before(targets.size(), false);
  for (size_t i = 0; i < targets.size(); ++i) {
    const DumpTarget& t = targets[i];
    RankStack& r = out[i];
    r.rank = t.rank;
    r.local_rank = t.local_rank;
    r.pid = t.pid;
    r.host = host;
    const char state = ProcState(t.pid);
    if (state == 0 || state == 'Z' || state == 'X') {
      r.missing = state == 0 ? "exited (no such process)" : "exited (a zombie)";
      continue;
    }
    stopped_before[i] = state == 'T' || state == 't';
    std::error_code ec;
    const std::string exe =
        std::filesystem::read_symlink(absl::StrCat("/proc/", t.pid, "/exe"), ec).filename();
    if (absl::StartsWith(exe, "python")) {
      r.tool = "py-spy";
      std::string py_spy = tools.py_spy;
      if (py_spy.empty()) py_spy = PySpyNextToInterpreter(t.pid);
      if (py_spy.empty()) py_spy = OnPath("py-spy");
      if (py_spy.empty()) {
        r.missing = absl::StrCat("a Python worker, and no py-spy next to its interpreter or on "
                                 "PATH (pip install 'dlrun[tools]' or py-spy, or set ",
                                 contract::kPySpy, ")");
        continue;
      }
      jobs[i].argv = {py_spy, "dump", "--nonblocking", "--json", "--pid", absl::StrCat(t.pid)};
    } else {
      r.tool = "eu-stack";
      if (tools.eu_stack.empty()) {
        r.missing = absl::StrCat("a native worker, and no eu-stack on PATH (Debian's elfutils, "
                                 "or set ", contract::kEuStack, ")");
        continue;
      }
      // Addresses only (-q) and where they are (-b: module, load address, offset): the worker
      // is stopped just for the unwinding; the names are looked up after it runs on
      // (SymbolizeStacks). Looking them up while attached held a train_unet rank for ~1 s.
      jobs[i].argv = {tools.eu_stack, "-q", "-m", "-b", "-p", absl::StrCat(t.pid)};
    }
    if (state == 'D') r.missing = "in uninterruptible sleep (D state)";  // replaced if read
  }
  RunTools(&jobs, t0 + bound);

  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i].argv.empty()) ReadToolRun(jobs[i], stopped_before[i], bound, &out[i]);
  }
  if (symbolize) {
    const auto left = bound - std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - t0);
    SymbolizeStacks(&out, tools, std::max(left, std::chrono::milliseconds(1000)));
  }
  return out;
}

void SymbolizeStacks(std::vector<RankStack>* ranks, const StackTools& tools,
                     std::chrono::milliseconds bound) {
  // Every frame still without a name, by module: one eu-addr2line per module, all at once.
  std::map<std::string, std::vector<StackFrame*>> by_module;
  for (RankStack& r : *ranks) {
    for (StackThread& t : r.threads) {
      for (StackFrame& f : t.frames) {
        if (f.function == "??" && !f.module.empty() && f.offset != 0) {
          by_module[f.module].push_back(&f);
        }
      }
    }
  }
  if (by_module.empty() || tools.eu_addr2line.empty()) return;
  std::vector<ToolRun> jobs;
  std::vector<std::vector<StackFrame*>*> frames_of;
  for (auto& [module, frames] : by_module) {
    ToolRun j;
    j.argv = {tools.eu_addr2line, "-f", "-C", "-e", module};
    for (StackFrame* f : frames) j.argv.push_back(absl::StrFormat("0x%x", f->offset));
    jobs.push_back(std::move(j));
    frames_of.push_back(&frames);
  }
  RunTools(&jobs, std::chrono::steady_clock::now() + bound);
  // A frame whose function was inlined into another: the caller, and where in it.
  std::map<const StackFrame*, std::pair<std::string, std::string>> inlined_into;
  for (size_t k = 0; k < jobs.size(); ++k) {
    if (!jobs[k].finished) continue;
    // Two lines per address, in order: the function, then file:line ("??:0" when unknown).
    std::vector<std::string> lines = absl::StrSplit(jobs[k].text, '\n');
    std::vector<StackFrame*>& frames = *frames_of[k];
    // An inlined call reads "callee inlined at file:line:col in caller": the callee is the
    // function, as in a debugger's innermost frame, and the caller a frame of its own after it
    // (the trainer's own function is often the caller of an inlined LibTorch one).
    for (size_t i = 0; i < frames.size() && 2 * i + 1 < lines.size(); ++i) {
      StackFrame& f = *frames[i];
      std::string function = lines[2 * i];
      if (const size_t in = function.find(" inlined at "); in != std::string::npos) {
        const std::string rest = function.substr(in + std::strlen(" inlined at "));
        if (const size_t caller = rest.find(" in "); caller != std::string::npos) {
          inlined_into[&f] = {rest.substr(caller + 4), rest.substr(0, caller)};
        }
        function.resize(in);
      }
      if (function != "??" && !function.empty()) f.function = function;
      const std::string& src = lines[2 * i + 1];
      if (src.compare(0, 2, "??") != 0) SetSourceLocation(src.substr(0, src.find(' ')), &f);
    }
  }
  if (inlined_into.empty()) return;
  for (RankStack& r : *ranks) {
    for (StackThread& t : r.threads) {
      std::vector<StackFrame> frames;
      frames.reserve(t.frames.size());
      for (const StackFrame& f : t.frames) {
        frames.push_back(f);
        auto it = inlined_into.find(&f);
        if (it == inlined_into.end()) continue;
        StackFrame caller;
        caller.module = f.module;
        caller.function = it->second.first;
        SetSourceLocation(it->second.second, &caller);
        frames.push_back(std::move(caller));
      }
      t.frames = std::move(frames);
    }
  }
}

}  // namespace dlrun::launcher
