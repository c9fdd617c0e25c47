// The profiling tools, run for the agent (profiler.h).
#include "launcher/profile/profiler.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/perf_event.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/contract.h"
#include "common/files.h"
#include "launcher/base/spawn_tool.h"
#include "launcher/profile/flamegraph.h"
#include "launcher/stacks/stacks.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace dlrun::launcher {
namespace {

using Deadline = std::chrono::steady_clock::time_point;

std::string FromEnv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Whether this process may open a perf event on itself (what `perf record -p` needs on its
// workers): kernel.perf_event_paranoid and the capabilities decide.
bool PerfEventsAllowed(std::string* why) {
  perf_event_attr attr{};
  attr.size = sizeof attr;
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_CPU_CLOCK;
  attr.disabled = 1;
  attr.exclude_kernel = 1;
  const long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
  if (fd >= 0) {
    close(static_cast<int>(fd));
    return true;
  }
  std::ifstream in("/proc/sys/kernel/perf_event_paranoid");
  std::string level;
  in >> level;
  *why = absl::StrCat("perf events are not allowed here (", std::strerror(errno),
                      level.empty() ? "" : absl::StrCat("; kernel.perf_event_paranoid=", level),
                      "): sysctl -w kernel.perf_event_paranoid=1 (or 2), or run with "
                      "CAP_PERFMON");
  return false;
}

// The last non-empty line of a file (a tool's log), for a note.
std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (!l.empty()) last = std::string(l);
  }
  return last.substr(0, 300);
}

bool WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  out << text;
  out.close();
  return out && std::rename(tmp.c_str(), path.c_str()) == 0;
}

// A tool process: its output appended to `log`, in its own process group with a clean signal
// mask (the agent blocks the signals it reads from its signalfd), and an exit pipe: the tool
// holds its write end as fd 3, so EOF on `exit_fd` means it has ended, whoever reaps it.
struct ToolProcess {
  pid_t pid = -1;
  int exit_fd = -1;
};

ToolProcess StartTool(const std::vector<std::string>& argv, const std::string& log,
                      int stdout_fd = -1) {
  ToolProcess t;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return t;
  ToolSpawn spawn;
  spawn.argv = argv;
  spawn.stdout_fd = stdout_fd;
  spawn.stdout_path = spawn.stderr_path = log;
  spawn.fd3 = p[1];
  spawn.own_group = true;
  auto pid = SpawnTool(spawn);
  close(p[1]);
  if (!pid.ok()) {
    close(p[0]);
    std::ofstream(log, std::ios::app) << pid.status().message() << "\n";
    return t;
  }
  t.pid = *pid;
  t.exit_fd = p[0];
  return t;
}

// Waits for the tool to end until `deadline` (then kills it); reaps it unless the agent's loop
// did. Returns whether it ended by itself.
bool WaitTool(ToolProcess* t, Deadline deadline) {
  if (t->pid < 0) return true;
  bool ended = false;
  while (!ended) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd fd{t->exit_fd, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(left)) < 0 && errno != EINTR) break;
    char c;
    if (fd.revents != 0 && read(t->exit_fd, &c, 1) <= 0) ended = true;
  }
  if (!ended) kill(-t->pid, SIGKILL);
  int status = 0;
  waitpid(t->pid, &status, 0);  // ECHILD when the agent's loop reaped it: nothing lost
  close(t->exit_fd);
  t->exit_fd = -1;
  t->pid = -1;
  return ended;
}

class ToolProfiler : public RankProfiler {
 public:
  ToolProfiler(ProfileSpec spec, std::string tool, std::string dir, std::string hostname)
      : spec_(std::move(spec)), tool_(std::move(tool)), dir_(std::move(dir)),
        hostname_(std::move(hostname)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
  }
  ~ToolProfiler() override {
    for (auto& [rank, r] : ranks_) {
      if (r.tool.pid > 0) kill(-r.tool.pid, SIGKILL);
      if (r.tool.exit_fd >= 0) close(r.tool.exit_fd);
      CloseControl(&r);
    }
  }

  bool Wants(int rank) const override { return spec_.Wants(rank); }
  std::vector<int> Ranks() const override { return spec_.ranks; }

  std::vector<std::string> Argv(int rank, const std::vector<std::string>& argv) const override {
    if (spec_.tool != ProfileTool::kNsys) return argv;
    return NsysArgv(spec_, tool_, absl::StrCat(dir_, "/rank", rank), argv);
  }

  std::map<std::string, std::string> Env(int rank) const override {
    return ProfileEnv(spec_, Path(rank, ProfileFileName(spec_.tool, rank)));
  }

  void Started(int rank, pid_t pid) override {
    Rank& r = ranks_.try_emplace(rank, spec_.steps).first->second;
    if (r.tool.pid > 0) {  // an earlier attempt's capture: ended with its worker
      kill(r.tool.pid, SIGINT);
      const Deadline d = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      if (!WaitTool(&r.tool, d)) r.note = "the tool did not finish in time";
      CloseControl(&r);
      Finish(rank, &r, d);
    }
    r.rank = rank;
    r.pid = pid;
    r.seen = true;
    const CaptureWindow::Action a = r.window.Started();
    if (spec_.tool == ProfileTool::kPerf && !r.window.done()) {
      StartPerf(rank, &r, a == CaptureWindow::Action::kStart);
    } else if (spec_.tool == ProfileTool::kPySpy && a == CaptureWindow::Action::kStart) {
      StartPySpy(rank, &r);
    }
  }

  void Step(int rank, int64_t step) override {
    auto it = ranks_.find(rank);
    if (it == ranks_.end()) return;
    Rank& r = it->second;
    r.stepped = true;
    switch (r.window.Step(step)) {
      case CaptureWindow::Action::kStart:
        if (spec_.tool == ProfileTool::kPerf) Control(&r, "enable");
        if (spec_.tool == ProfileTool::kPySpy) StartPySpy(rank, &r);
        break;
      case CaptureWindow::Action::kStop:
        if (spec_.tool == ProfileTool::kPerf) Control(&r, "disable");
        if (r.tool.pid > 0) kill(r.tool.pid, SIGINT);  // the tool writes its file and exits
        r.captured_steps = true;
        break;
      case CaptureWindow::Action::kNone:
        break;
    }
  }

  void Exited(int rank) override {
    auto it = ranks_.find(rank);
    if (it == ranks_.end()) return;
    // perf and py-spy end with the process they watch; SIGINT makes sure.
    if (it->second.tool.pid > 0) kill(it->second.tool.pid, SIGINT);
  }

  std::vector<telemetry::RankProfile> Collect(std::chrono::milliseconds bound) override {
    const Deadline deadline = std::chrono::steady_clock::now() + bound;
    for (auto& [rank, r] : ranks_) {
      if (r.tool.pid > 0) {
        kill(r.tool.pid, SIGINT);
        if (!WaitTool(&r.tool, deadline)) r.note = "the tool did not finish in time";
        CloseControl(&r);
        r.pending = true;
      }
    }
    std::vector<telemetry::RankProfile> out;
    for (auto& [rank, r] : ranks_) {
      if (r.pending) Finish(rank, &r, deadline);
      r.pending = false;
      if (!r.seen) continue;
      telemetry::RankProfile p = r.result;
      if (spec_.steps && !r.stepped && p.path.empty()) {
        // The window opens at a step record: without any, nothing was captured.
        p.note = absl::StrCat("no capture: --profile-steps ", spec_.steps->first, ":",
                              spec_.steps->last, " counts step records and rank ", rank,
                              " sent none (Python: dlrun_report.report_step or "
                              "timed(report=True); C++: dlrun::worker::report_step)");
      }
      p.rank = rank;
      p.host = hostname_;
      p.tool = ProfileToolName(spec_.tool);
      if (spec_.tool == ProfileTool::kNsys || spec_.tool == ProfileTool::kTorch) {
        const std::string f = Path(rank, ProfileFileName(spec_.tool, rank));
        std::error_code ec;
        p.path = std::filesystem::exists(f, ec) ? f : "";
        p.note = p.path.empty() ? absl::StrCat(ProfileToolName(spec_.tool), " wrote no ",
                                               ProfileFileName(spec_.tool, rank),
                                               " (see the rank's output)")
                                : "";
      }
      out.push_back(std::move(p));
    }
    return out;
  }

 private:
  struct Rank {
    explicit Rank(std::optional<StepRange> steps) : window(steps) {}
    CaptureWindow window;
    int rank = 0;
    pid_t pid = -1;
    bool seen = false;
    ToolProcess tool;
    int ctl_fd = -1, ack_fd = -1;  // perf's control fifos
    bool pending = false;          // a capture to turn into files
    bool captured_steps = false;
    bool stepped = false;  // a step record came
    std::string note;
    telemetry::RankProfile result;
  };

  std::string Path(int rank, const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }
  std::string Stem(int rank) const { return absl::StrCat(dir_, "/rank", rank); }

  void StartPerf(int rank, Rank* r, bool enabled) {
    // DWARF call chains: PyPI's LibTorch, like most libraries, has no frame pointers; 32 KB of
    // stack per sample reaches from a kernel up to the ATen operator (conv3d) that called it.
    std::vector<std::string> argv = {tool_, "record", "--call-graph", "dwarf,32768", "-F", "99", "-p",
                                     absl::StrCat(r->pid), "-o", Stem(rank) + ".perf.data"};
    if (spec_.steps) {
      const std::string ctl = Stem(rank) + ".perf.ctl", ack = Stem(rank) + ".perf.ack";
      for (const std::string& f : {ctl, ack}) {
        unlink(f.c_str());
        mkfifo(f.c_str(), 0600);
      }
      // Opened here first (read-write: no wait for the other end), so perf's opens never block.
      r->ctl_fd = open(ctl.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
      r->ack_fd = open(ack.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
      argv.push_back(absl::StrCat("--control=fifo:", ctl, ",", ack));
      if (!enabled) argv.push_back("--delay=-1");
    }
    argv.insert(argv.end(), spec_.args.begin(), spec_.args.end());
    r->note.clear();
    r->tool = StartTool(argv, Stem(rank) + ".perf.log");
  }

  void StartPySpy(int rank, Rank* r) {
    std::vector<std::string> argv = {tool_, "record", "--pid", absl::StrCat(r->pid), "--format",
                                     "raw", "-o", Stem(rank) + ".folded"};
    argv.insert(argv.end(), spec_.args.begin(), spec_.args.end());
    r->note.clear();
    r->tool = StartTool(argv, Stem(rank) + ".py-spy.log");
  }

  void Control(Rank* r, const char* what) {
    if (r->ctl_fd < 0) return;
    const std::string line = absl::StrCat(what, "\n");
    if (write(r->ctl_fd, line.data(), line.size()) < 0) {
      spdlog::debug("perf control: {}", std::strerror(errno));
    }
    char buf[64];
    while (r->ack_fd >= 0 && read(r->ack_fd, buf, sizeof buf) > 0) {
    }
  }

  void CloseControl(Rank* r) {
    if (r->ctl_fd < 0) return;
    for (int* fd : {&r->ctl_fd, &r->ack_fd}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    for (const char* end : {".perf.ctl", ".perf.ack"}) unlink((Stem(r->rank) + end).c_str());
  }

  // The capture into the rank's flame graph and hot frames.
  void Finish(int rank, Rank* r, Deadline deadline) {
    telemetry::RankProfile& p = r->result;
    p = {};
    Folded folded;
    const std::string stem = Stem(rank);
    if (spec_.tool == ProfileTool::kPerf) {
      std::error_code ec;
      if (!std::filesystem::exists(stem + ".perf.data", ec)) {
        p.note = absl::StrCat("perf wrote nothing: ", LastLine(stem + ".perf.log"));
        return;
      }
      const std::string script = stem + ".perf.txt";
      const int out = open(script.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      // --no-inline: naming inlined frames runs addr2line over LibTorch (minutes).
      ToolProcess t = StartTool({tool_, "script", "--no-inline", "-i", stem + ".perf.data"},
                                stem + ".perf.log", out);
      if (out >= 0) close(out);
      if (!WaitTool(&t, deadline)) {
        p.note = "perf script did not finish in time";
        return;
      }
      folded = FoldPerfScript(ReadWholeFile(script));
      std::filesystem::remove(script, ec);
    } else {
      auto parsed = ParseFolded(ReadWholeFile(stem + ".folded"));
      if (!parsed.ok()) {
        p.note = std::string(parsed.status().message());
        return;
      }
      folded = *std::move(parsed);
    }
    if (folded.empty()) {
      std::string said = LastLine(absl::StrCat(stem, ".", ProfileToolName(spec_.tool), ".log"));
      p.note = absl::StrCat("no samples", said.empty() ? "" : ": " + said);
      return;
    }
    if (spec_.tool == ProfileTool::kPerf) WriteFile(stem + ".folded", FoldedText(folded));
    const std::string svg = stem + ".svg";
    const std::string title = absl::StrCat(
        "rank ", rank, " on ", hostname_, ", ", ProfileToolName(spec_.tool),
        spec_.steps ? absl::StrCat(", steps ", spec_.steps->first, "-", spec_.steps->last) : "");
    if (!WriteFile(svg, FlameGraphSvg(folded, title))) {
      p.note = absl::StrCat("cannot write ", svg, ": ", std::strerror(errno));
      return;
    }
    p.path = svg;
    p.samples = TotalSamples(folded);
    for (const HotFrame& h : HotFrames(folded, 5)) {
      p.hot.emplace_back(spec_.tool == ProfileTool::kPerf ? ShortCxxName(h.frame) : h.frame,
                         h.fraction);
    }
    if (spec_.steps && !r->captured_steps) {
      p.note = absl::StrCat("the rank ended before step ", spec_.steps->last,
                            ": the capture runs to its end");
    }
    if (!r->note.empty()) p.note = r->note;
  }

  ProfileSpec spec_;
  std::string tool_;
  std::string dir_;
  std::string hostname_;
  std::map<int, Rank> ranks_;
};

}  // namespace

absl::StatusOr<std::string> FindProfileTool(const ProfileSpec& spec, const std::string& python) {
  const std::string what = absl::StrCat("--profile ", ProfileToolName(spec.tool), ": ");
  switch (spec.tool) {
    case ProfileTool::kNone:
    case ProfileTool::kTorch:
      return std::string();
    case ProfileTool::kNsys: {
      std::string nsys = FromEnv(contract::kNsysTool);
      if (nsys.empty()) nsys = OnPath("nsys");
      if (!Executable(nsys)) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, "nsys is not installed (NVIDIA Nsight Systems, the nsight-systems package of "
                  "NVIDIA's CUDA repository; or set ", contract::kNsysTool, ")"));
      }
      return nsys;
    }
    case ProfileTool::kPerf: {
      std::string perf = FromEnv(contract::kPerfTool);
      if (perf.empty()) perf = OnPath("perf");
      if (!Executable(perf)) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, "perf is not installed (Debian: apt install linux-perf; or set ",
            contract::kPerfTool, ")"));
      }
      std::string why;
      if (!PerfEventsAllowed(&why)) return absl::FailedPreconditionError(what + why);
      return perf;
    }
    case ProfileTool::kPySpy: {
      std::string py_spy = FromEnv(contract::kPySpy);
      if (py_spy.empty()) {
        // Next to the workers' interpreter (a virtual environment's bin/), else on PATH.
        const std::string py = python.find('/') == std::string::npos ? OnPath(python) : python;
        const std::string beside =
            py.empty() ? "" : (std::filesystem::path(py).parent_path() / "py-spy").string();
        py_spy = Executable(beside) ? beside : OnPath("py-spy");
      }
      if (!Executable(py_spy)) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, "py-spy is not installed (pip install 'dlrun[tools]' or py-spy, in the workers' "
                  "Python environment; or set ", contract::kPySpy, ")"));
      }
      return py_spy;
    }
  }
  return std::string();
}

std::unique_ptr<RankProfiler> MakeToolProfiler(ProfileSpec spec, std::string tool, std::string dir,
                                               std::string hostname) {
  return std::make_unique<ToolProfiler>(std::move(spec), std::move(tool), std::move(dir),
                                        std::move(hostname));
}

}  // namespace dlrun::launcher
