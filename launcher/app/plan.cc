#include "launcher/app/plan.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/contract.h"
#include "launcher/app/commands.h"
#include "launcher/detect/env_detect.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

absl::StatusOr<std::vector<std::string>> ResolveGpus(const GpuSpec& spec, int nproc,
                                                     const GpuFacts& facts) {
  using M = GpuSpec::Mode;
  std::vector<std::string> ids;
  if (spec.mode == M::kInherit) return ids;
  if (spec.mode == M::kLeastLoaded && facts.loads &&
      static_cast<int>(facts.loads->size()) >= nproc) {
    for (int i : PickLeastLoaded(*facts.loads, nproc)) ids.push_back(std::to_string(i));
    spdlog::info("--gpus least-loaded: the {} least-loaded GPU(s) by memory used and "
                 "utilisation: {}",
                 nproc, absl::StrJoin(ids, ","));
    return ids;
  }
  if (spec.mode == M::kPerWorker || spec.mode == M::kLeastLoaded) {
    if (facts.visible_devices.has_value()) {
      ids = absl::StrSplit(*facts.visible_devices, ',', absl::SkipEmpty());  // the scheduler's
    } else {
      for (int i = 0; i < facts.device_count; ++i) ids.push_back(std::to_string(i));
    }
    if (static_cast<int>(ids.size()) < nproc) return std::vector<std::string>{};  // CPU run
  } else {
    ids = spec.ids;
    if (static_cast<int>(ids.size()) < nproc) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid value '", spec.text, "' for --gpus: expected at least ", nproc,
          " device ids (one per worker), inherit, per-worker or least-loaded"));
    }
  }
  ids.resize(nproc);
  return ids;
}

bool RunsPython(const LaunchOptions& o) {
  return o.module || (!o.no_python && absl::EndsWith(o.command[0], ".py"));
}

std::vector<std::string> WorkerArgv(const LaunchOptions& o, const std::string& python) {
  std::vector<std::string> argv;
  if (o.module) {
    argv = {python, "-u", "-m"};
  } else if (RunsPython(o)) {
    argv = {python, "-u"};
  }
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

namespace {

// The warm spare's bootstrap. A thread at idle priority imports torch (the slow part of a
// Python worker's start) and torch._dynamo (PyTorch 2.x's DistributedDataParallel imports it,
// with sympy and ~900 modules, when the first one is built: ~1 s that a promoted spare would
// otherwise spend after the fault), so the spare takes no CPU from the workers it stands beside.
// The main thread waits for the worker's environment on contract::kSpareFd, then for the
// imports, replaces the environment, makes a rank other than 0 wait for rank 0's store port
// before its TCPStore client connects, and runs the script as `python SCRIPT` does (or the
// module, as `python -m`).
constexpr char kSpareBootstrap[] = R"py(import os, sys, threading
fd = int(os.environ.pop("{SPARE_FD}"))
def _dlrun_warm():
    # At idle priority (this thread only): the imports take CPU-seconds that the running
    # workers, often pinned to the same cores, would otherwise lose while they train.
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except Exception:
        pass
    try:
        import torch, torch.distributed, torch.nn.parallel
        import torch._dynamo
    except Exception:
        pass
_dlrun_warming = threading.Thread(target=_dlrun_warm, name="dlrun-warm", daemon=True)
_dlrun_warming.start()
data = bytearray()
while True:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        break
    data += chunk
os.close(fd)
if not data:
    os._exit(0)
_dlrun_warming.join()
del _dlrun_warming, _dlrun_warm
os.environ.clear()
for kv in bytes(data).split(b"\0"):
    key, eq, value = kv.partition(b"=")
    if key and eq:
        os.environb[key] = value
del data, chunk
# Ranks other than 0 meet rank 0's TCPStore. Promoted together, one may get there before rank 0
# has bound it, and TCPStore's client then backs off for up to a second: wait for the port first.
try:
    from torch.distributed import rendezvous as _rdzv
    def _dlrun_store_wait(create):
        def wait_then_create(hostname, port, rank, world_size, timeout, *args, **kwargs):
            if rank != 0:
                import socket, time
                end = time.monotonic() + min(timeout.total_seconds(), 60.0)
                while time.monotonic() < end:
                    try:
                        socket.create_connection((hostname, port), timeout=1.0).close()
                        break
                    except OSError:
                        time.sleep(0.005)
            return create(hostname, port, rank, world_size, timeout, *args, **kwargs)
        return wait_then_create
    _rdzv._create_c10d_store = _dlrun_store_wait(_rdzv._create_c10d_store)
except Exception:
    pass
import runpy
args = sys.argv[1:]
if args[0] == "-m":
    sys.argv = args[1:]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
else:
    # As `python SCRIPT` (3.9+): __file__ absolute, sys.argv[0] as given, sys.path[0] the
    # script's directory, run in the real __main__ module (so pickling its classes works).
    def _dlrun_run_script(script):
        path = os.path.abspath(script)
        sys.argv = args
        sys.path[0] = os.path.dirname(path)
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        g = sys.modules["__main__"].__dict__
        builtins = g["__builtins__"]
        g.clear()
        g.update(__name__="__main__", __file__=path, __cached__=None, __doc__=None,
                 __loader__=None, __package__=None, __spec__=None, __builtins__=builtins)
        exec(code, g)
    _dlrun_run_script(args[0])
)py";

bool IsPythonInterpreter(const std::string& path) {
  absl::string_view base(path);
  base.remove_prefix(path.rfind('/') + 1);  // npos + 1 == 0: no '/'
  if (!absl::ConsumePrefix(&base, "python")) return false;
  return base.find_first_not_of("0123456789.") == std::string::npos;
}

}  // namespace

std::vector<std::string> WarmSpareArgv(const std::vector<std::string>& argv) {
  if (argv.size() < 2 || !IsPythonInterpreter(argv[0])) return {};
  // Interpreter flags without a value, kept as they are; anything else before the script (-c,
  // -X opt, -W arg, a combined flag) means no spare.
  static const std::set<std::string> kFlags = {"-u", "-O", "-OO", "-B", "-E", "-s",
                                                          "-S", "-I", "-q", "-b", "-bb", "-d",
                                                          "-v", "-P"};
  size_t i = 1;
  while (i < argv.size() && kFlags.count(argv[i]) > 0) ++i;
  if (i >= argv.size()) return {};
  const bool module = argv[i] == "-m";
  if (module ? i + 1 >= argv.size() || argv[i + 1].empty() || argv[i + 1][0] == '-'
             : argv[i].empty() || argv[i][0] == '-') {
    return {};
  }
  std::vector<std::string> out(argv.begin(), argv.begin() + static_cast<long>(i));
  out.push_back("-c");
  out.push_back(absl::StrReplaceAll(kSpareBootstrap, {{"{SPARE_FD}", contract::kSpareFd}}));
  out.insert(out.end(), argv.begin() + static_cast<long>(i), argv.end());
  return out;
}

int OmpThreads(bool user_set, int ncpus, int nproc) {
  if (user_set || nproc <= 1) return 0;
  return std::max(1, ncpus / nproc);
}

std::vector<std::vector<int>> WorkerCpus(CpuAffinity mode, const std::vector<int>& allowed,
                                         const CpuTopology& topology, int nproc) {
  std::vector<std::vector<int>> out;
  const int ncpu = static_cast<int>(allowed.size());
  if (mode == CpuAffinity::kBlock) {
    if (ncpu < nproc || nproc <= 0) return out;
    const int per = ncpu / nproc;
    for (int lr = 0; lr < nproc; ++lr) {
      out.emplace_back(allowed.begin() + lr * per, allowed.begin() + (lr + 1) * per);
    }
    return out;
  }
  if (mode != CpuAffinity::kNode && mode != CpuAffinity::kSocket) return out;
  std::vector<std::vector<int>> groups;
  for (const auto& g : mode == CpuAffinity::kNode ? topology.numa_nodes : topology.sockets) {
    std::vector<int> mine;
    for (int c : g) {
      if (std::find(allowed.begin(), allowed.end(), c) != allowed.end()) mine.push_back(c);
    }
    if (!mine.empty()) groups.push_back(std::move(mine));
  }
  if (groups.empty()) return out;  // no topology: no pinning
  for (int lr = 0; lr < nproc; ++lr) out.push_back(groups[lr % groups.size()]);
  return out;
}

void SplitSignals(const std::vector<int>& handled, AgentOptions* a) {
  for (int sig : handled) {
    (sig == SIGUSR1 || sig == SIGUSR2 ? a->passthrough_signals : a->forwarded_signals)
        .push_back(sig);
  }
}

std::string DefaultPython(const EnvLookup& env) {
  if (std::optional<std::string> v = env(contract::kPythonExec); v && !v->empty()) return *v;
  // `pip install dlrun` into a virtual environment (pyvenv.cfg) or a conda environment
  // (conda-meta/): that environment's interpreter, as torchrun runs its workers with its own
  // sys.executable. A dlrun in /usr/local/bin or a build tree keeps python3 from PATH.
  const std::string self = SelfPath();
  const size_t slash = self.rfind('/');
  if (slash != std::string::npos) {
    const std::string bin = self.substr(0, slash);
    const std::string beside = bin + "/python3";
    std::error_code ec;
    const bool env = std::filesystem::exists(bin + "/../pyvenv.cfg", ec) ||
                     std::filesystem::is_directory(bin + "/../conda-meta", ec);
    if (env && access(beside.c_str(), X_OK) == 0) return beside;
  }
  return "python3";
}

std::string PythonHelperDir(const std::string& exe) {
  const size_t slash = exe.rfind('/');
  if (slash == std::string::npos) return "";
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::weakly_canonical(
      std::filesystem::path(exe.substr(0, slash)) / ".." / "share" / "dlrun" / "python", ec);
  if (ec || !std::filesystem::exists(dir / "dlrun_report.py", ec)) return "";
  return dir.string();
}

absl::Status CheckProgram(const std::vector<std::string>& argv, const std::string& script,
                          const std::string& path) {
  auto refuse = [](const std::string& what, const std::string& name, int err) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot run ", what, " '", name, "': ", std::strerror(err)));
  };
  const std::string& program = argv.at(0);
  if (program.find('/') != std::string::npos) {
    if (access(program.c_str(), X_OK) != 0) return refuse("program", program, errno);
  } else {
    int err = ENOENT;  // as execvp: EACCES if a match was found but none could be run
    bool found = false;
    for (absl::string_view dir : absl::StrSplit(path, ':')) {
      const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
      if (access(candidate.c_str(), F_OK) != 0) continue;
      struct stat st {};
      if (access(candidate.c_str(), X_OK) == 0 && stat(candidate.c_str(), &st) == 0 &&
          S_ISREG(st.st_mode)) {
        found = true;
        break;
      }
      err = EACCES;
    }
    if (!found) {
      if (err == ENOENT) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot run program '", program, "': not found in PATH"));
      }
      return refuse("program", program, err);
    }
  }
  if (!script.empty()) {
    struct stat st {};
    if (access(script.c_str(), R_OK) != 0) return refuse("script", script, errno);
    if (stat(script.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return refuse("script", script, EISDIR);
    }
  }
  return absl::OkStatus();
}

Assignment StaticAssignment(const LaunchOptions& o, int nproc) {
  Assignment a;
  a.node_rank = o.node_rank;
  a.num_nodes = o.max_nodes;
  a.local_world_size = nproc;
  a.world_size = o.max_nodes * nproc;
  a.rank_offset = o.node_rank * nproc;
  a.role = o.role;
  std::tie(a.master_addr, a.master_port) = StaticMaster(o);
  a.run_id = o.rdzv_id;
  a.max_restarts = o.max_restarts;
  return a;
}

absl::StatusOr<int> ResolveNprocPerNode(const NprocSpec& spec, int num_gpus, int num_cpus) {
  switch (spec.kind) {
    case NprocSpec::Kind::kCpu:
      return num_cpus;
    case NprocSpec::Kind::kGpu:
      if (num_gpus <= 0) {
        return absl::FailedPreconditionError(
            "--nproc-per-node gpu: no GPU found on this node (use cpu or a number)");
      }
      return num_gpus;
    case NprocSpec::Kind::kAuto:
      return num_gpus > 0 ? num_gpus : num_cpus;
    case NprocSpec::Kind::kXpu:
      return absl::FailedPreconditionError(
          "--nproc-per-node xpu: dlrun does not count Intel XPUs (use a number)");
    case NprocSpec::Kind::kCount:
      break;
  }
  return spec.count;
}

absl::Status CheckLocalRanks(const LaunchOptions& o, int nproc) {
  for (int r : o.local_ranks_filter) {
    if (r >= nproc) {
      return cli::BadValue("local-ranks-filter", o.local_ranks_filter_text,
                           absl::StrCat("comma-separated local ranks in [0, ", nproc, ")"));
    }
  }
  return absl::OkStatus();
}

namespace {

std::string RandomRunId() {
  std::random_device rd;
  return absl::StrCat("dlrun-", absl::Hex(rd()), absl::Hex(rd()));
}

// torchrun flags that dlrun accepts without acting on them: one line each, when given.
void NoteIgnoredFlags(const LaunchOptions& o) {
  if (o.given.count("start-method")) {
    spdlog::info("--start-method {}: no effect (dlrun starts each worker as a new process)",
                 o.start_method);
  }
  if (o.given.count("logs-specs")) {
    spdlog::info("--logs-specs {}: no effect (dlrun writes torchrun's default layout)",
                 o.logs_specs);
  }
  if (o.given.count("event-log-handler")) {
    spdlog::info("--event-log-handler {}: no effect", o.event_log_handler);
  }
  for (const char* f : {"duplicate-stdout-filters", "duplicate-stderr-filters"}) {
    if (o.given.count(f)) spdlog::info("--{}: no effect (grep the --log-dir files)", f);
  }
  if (o.given.count("monitor-interval")) {
    spdlog::info("--monitor-interval: no effect (dlrun sees worker exits at once)");
  }
}

// Worker environment and process settings that follow torchrun: CUDA_VISIBLE_DEVICES, Python,
// threads, the user's NCCL settings, CPU pinning.
absl::Status ApplyEnvironmentRules(const LaunchOptions& o, int nproc, const Machine& m,
                                   const EnvLookup& env, AgentOptions* a) {
  // torchrun 2.x's --virtual-local-rank: every worker sees its own GPU as device 0.
  GpuSpec spec = o.gpus;
  if (o.virtual_local_rank && spec.mode == GpuSpec::Mode::kInherit) {
    spec.mode = GpuSpec::Mode::kPerWorker;
  }
  auto gpus = ResolveGpus(spec, nproc, m.gpus);
  if (!gpus.ok()) return gpus.status();
  a->gpus = *gpus;
  a->argv = WorkerArgv(o, DefaultPython(env));
  if (o.spare_workers != SpareWorkers::kOff) a->spare_argv = WarmSpareArgv(a->argv);
  if (o.spare_workers == SpareWorkers::kOn && a->spare_argv.empty()) a->spare_argv = a->argv;
  a->extra_env[contract::kSignalsToHandle] = o.signals_to_handle_text;  // as torchrun 2.x
  if (RunsPython(o) && !env(contract::kPythonUnbuffered)) {
    // (insert_or_assign: GCC 12's -Wrestrict misfires on `= "1"` once this is inlined)
    a->extra_env.insert_or_assign(contract::kPythonUnbuffered, std::string("1"));
  }
  const std::string helper = PythonHelperDir(SelfPath());
  if (!helper.empty()) {
    const std::string path = env(contract::kPythonPath).value_or("");
    a->extra_env[contract::kPythonPath] = path.empty() ? helper : absl::StrCat(path, ":", helper);
  }
  a->omp_threads = OmpThreads(env(contract::kOmpNumThreads).has_value(),
                              static_cast<int>(m.cpus.size()), nproc);
  if (a->omp_threads > 0) {
    spdlog::info("OMP_NUM_THREADS is unset: setting it to {} ({} CPUs / {} workers)",
                 a->omp_threads, m.cpus.size(), nproc);
  }
  for (const char* k : {contract::kNcclAsyncErrorHandling, contract::kNcclAsyncErrorHandlingOld}) {
    if (env(k)) a->keep_inherited.push_back(k);
  }
  a->worker_cpus = WorkerCpus(o.cpu_affinity, m.cpus, m.topology, nproc);
  return absl::OkStatus();
}

absl::StatusOr<AgentOptions> BuildAgentOptions(const LaunchOptions& o, int nproc,
                                               const Machine& m, const EnvLookup& env) {
  AgentOptions a;
  a.nproc = nproc;
  SplitSignals(o.signals_to_handle, &a);
  a.grace = o.grace_period;
  a.hang_timeout = o.hang_timeout;
  a.capture_before_kill = o.capture_before_kill;
  const StackTools tools = FindStackTools();
  a.dump_stacks = [tools, host = m.hostname](const std::vector<DumpTarget>& targets,
                                             Millis bound) {
    return DumpStacks(targets, tools, host, bound, /*symbolize=*/false);
  };
  a.name_frames = [tools](std::vector<RankStack>* ranks) {
    SymbolizeStacks(ranks, tools, defaults::kStacksBound);
  };
  a.console_prefix_template = o.log_line_prefix_template;
  a.virtual_local_rank = o.virtual_local_rank;
  a.redirects = o.redirects.PerRank(nproc);
  if (absl::Status s = CheckLocalRanks(o, nproc); !s.ok()) return s;
  a.console_ranks = o.local_ranks_filter;
  if (absl::Status s = ApplyEnvironmentRules(o, nproc, m, env, &a); !s.ok()) return s;
  a.stdout_pty = isatty(STDOUT_FILENO) == 1;
  a.exit_with_worker_code = o.worker_exit_code;
  a.telemetry.report_json = o.report_json;
  a.telemetry.on = o.telemetry;
  if (o.telemetry_flags.metrics_port >= 0 && !o.telemetry) {
    return absl::InvalidArgumentError(
        "--metrics-port needs telemetry: drop --telemetry off, or the port");
  }
  a.program_name = o.command[0];
  a.telemetry.program = std::filesystem::path(o.command[0]).filename().string();
  a.hostname = m.hostname;
  return a;
}

}  // namespace

absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchOptions& o, const Machine& m,
                                      const EnvLookup& env) {
  const std::string python = DefaultPython(env);  // a readlink and two stats: once per launch
  if (absl::Status s = CheckProgram(WorkerArgv(o, python),
                                    RunsPython(o) && !o.module ? o.command[0] : "",
                                    env("PATH").value_or("/usr/local/bin:/usr/bin:/bin"));
      !s.ok()) {
    return s;
  }
  LaunchPlan plan;
  if (o.profile.On()) {  // a missing tool is said first, and no worker starts
    auto tool = FindProfileTool(
        o.profile, WorkerArgv(o, python)[0]);
    if (!tool.ok()) return tool.status();
    plan.profile_tool = *std::move(tool);
  }
  auto nproc = ResolveNprocPerNode(o.nproc_per_node, m.gpus.device_count,
                                   static_cast<int>(m.cpus.size()));
  if (!nproc.ok()) return nproc.status();
  plan.nproc = *nproc;
  auto agent = BuildAgentOptions(o, plan.nproc, m, env);
  if (!agent.ok()) return agent.status();
  plan.agent = *std::move(agent);
  plan.run_id = o.standalone ? RandomRunId() : o.rdzv_id;
  NoteIgnoredFlags(o);
  return plan;
}

}  // namespace dlrun::launcher
