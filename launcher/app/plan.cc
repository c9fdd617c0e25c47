#include "launcher/app/plan.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <algorithm>
#include <filesystem>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/contract.h"
#include "common/scheduler_env.h"
#include "launcher/app/commands.h"
#include "common/host_port.h"
#include "launcher/detect/env_detect.h"
#include "launcher/detect/net.h"
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

namespace {
bool SlurmAddsUsr1(const LaunchOptions& o, const EnvLookup& env) {
  return !o.signals_to_handle_given && env(sched::kSlurmJobId).has_value() &&
         std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), SIGUSR1) ==
             o.signals_to_handle.end();
}
}  // namespace

std::vector<int> HandledSignals(const LaunchOptions& o, const EnvLookup& env) {
  std::vector<int> handled = o.signals_to_handle;
  if (SlurmAddsUsr1(o, env)) handled.push_back(SIGUSR1);
  return handled;
}

std::string HandledSignalsText(const LaunchOptions& o, const EnvLookup& env) {
  return SlurmAddsUsr1(o, env) ? o.signals_to_handle_text + ",SIGUSR1" : o.signals_to_handle_text;
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
  if (o.fork_server) a->fork_server_argv = WarmSpareArgv(a->argv);
  if (o.spare_workers == SpareWorkers::kOn && a->spare_argv.empty()) a->spare_argv = a->argv;
  if (o.spare_workers == SpareWorkers::kAuto && o.max_restarts == 0) {
    // No restart will promote a spare: only an in-process recovery, so the spares (~380 MB of
    // memory each) start when the program declares one, not beside every Python worker.
    a->spare_argv_on_declaration = std::exchange(a->spare_argv, {});
  }
  a->spares_on_declaration = o.spare_workers != SpareWorkers::kOff;
  if (o.spare_workers == SpareWorkers::kAuto && !a->fork_server_argv.empty()) {
    // Every start is a fork of the node's server: spares (forks too) made no measurable
    // difference, quiet or busy (bench/RESULTS.md), and cost memory. `on` keeps them.
    a->spare_argv.clear();
    a->spare_argv_on_declaration.clear();
    a->spares_on_declaration = false;
  }
  a->telemetry.warm_spares = !a->spare_argv.empty();
  a->extra_env[contract::kSignalsToHandle] = HandledSignalsText(o, env);  // as torchrun 2.x
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
  std::error_code ec;
  if (!std::filesystem::exists("/proc/self/stat", ec)) {  // a chroot or sandbox without /proc
    spdlog::warn(
        "/proc is not mounted: the report has the workers' memory and CPU time only from their "
        "exits, and a hang's stacks and out-of-memory kills cannot be read");
  }
  a->worker_cpus = WorkerCpus(o.cpu_affinity, m.cpus, m.topology, nproc);
  return absl::OkStatus();
}

// --recovery: in-process recovery's new groups get a fresh port each, held (bound, not
// listening) until dlrun ends, as the standalone backend's attempts; or the ordinary restart.
void PlanRecovery(const LaunchOptions& o, AgentOptions* a) {
  if (o.recovery == "in-process") {
    a->pick_master_port = [held = std::make_shared<std::vector<PortReservation>>()](
                              const std::string& addr) {
      held->push_back(ReservePort(Unbracketed(addr)));
      return held->back().port();
    };
  } else {
    a->recovery = AgentOptions::Recovery::kRestart;
  }
  a->recovery_timeout = o.recovery_timeout;
  a->single_node_job = o.max_nodes == 1;
}

absl::StatusOr<AgentOptions> BuildAgentOptions(const LaunchOptions& o, int nproc,
                                               const Machine& m, const EnvLookup& env) {
  AgentOptions a;
  a.nproc = nproc;
  SplitSignals(HandledSignals(o, env), &a);
  a.grace = o.grace_period;
  a.hang.timeout = o.hang_timeout;
  a.hang.on = o.hang_detect;
  a.hang.step_floor = o.hang_floor;
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
  PlanRecovery(o, &a);
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
