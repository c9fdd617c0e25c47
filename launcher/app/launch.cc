// `dlrun [options] PROGRAM ARGS` and `dlrun env`: options -> detection -> plan -> membership
// source -> agent. docs/ARCHITECTURE.md follows one launch through these steps.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "common/local_address.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/posix_processes.h"
#include "launcher/app/commands.h"
#include "launcher/app/plan.h"
#include "launcher/detect/env_detect.h"
#include "launcher/detect/net.h"
#include "launcher/rdzv/failover.h"
#include "launcher/rdzv/rdzv_config.h"
#include "launcher/rdzv/rdzv_loader.h"
#include "launcher/rdzv/rdzv_source.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

// The CPUs this process may run on (its affinity mask, e.g. what Slurm gave the step).
std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < std::max(1L, n); ++c) cpus.push_back(c);
  }
  return cpus;
}

int CountGpus() {
  int n = 0;
  while (std::filesystem::exists("/dev/nvidia" + std::to_string(n))) ++n;
  return n;
}

std::string RandomRunId() {
  std::random_device rd;
  return absl::StrCat("dlrun-", absl::Hex(rd()), absl::Hex(rd()));
}

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
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
absl::Status ApplyEnvironmentRules(const LaunchOptions& o, int nproc, const std::vector<int>& cpus,
                                   const EnvLookup& env, AgentOptions* a) {
  GpuFacts gpu;
  gpu.visible_devices = env(contract::kCudaVisibleDevices);
  if (o.gpus.mode == GpuSpec::Mode::kLeastLoaded) gpu.loads = QueryGpuLoads();
  gpu.device_count = CountGpus();
  // torchrun 2.x's --virtual-local-rank: every worker sees its own GPU as device 0.
  GpuSpec spec = o.gpus;
  if (o.virtual_local_rank && spec.mode == GpuSpec::Mode::kInherit) {
    spec.mode = GpuSpec::Mode::kPerWorker;
  }
  auto gpus = ResolveGpus(spec, nproc, gpu);
  if (!gpus.ok()) return gpus.status();
  a->gpus = *gpus;
  a->argv = WorkerArgv(o, env(contract::kPythonExec).value_or("python3"));
  if (o.spare_workers != SpareWorkers::kOff) a->spare_argv = WarmSpareArgv(a->argv);
  if (o.spare_workers == SpareWorkers::kOn && a->spare_argv.empty()) a->spare_argv = a->argv;
  a->extra_env[contract::kSignalsToHandle] = o.signals_to_handle_text;  // as torchrun 2.x
  if (RunsPython(o) && !env(contract::kPythonUnbuffered)) {
    a->extra_env[contract::kPythonUnbuffered] = "1";
  }
  const std::string helper = PythonHelperDir(SelfPath());
  if (!helper.empty()) {
    const std::string path = env(contract::kPythonPath).value_or("");
    a->extra_env[contract::kPythonPath] = path.empty() ? helper : absl::StrCat(path, ":", helper);
  }
  a->omp_threads = OmpThreads(env(contract::kOmpNumThreads).has_value(),
                              static_cast<int>(cpus.size()), nproc);
  if (a->omp_threads > 0) {
    spdlog::info("OMP_NUM_THREADS is unset: setting it to {} ({} CPUs / {} workers)",
                 a->omp_threads, cpus.size(), nproc);
  }
  for (const char* k : {contract::kNcclAsyncErrorHandling, contract::kNcclAsyncErrorHandlingOld}) {
    if (env(k)) a->keep_inherited.push_back(k);
  }
  const bool by_topology =
      o.cpu_affinity == CpuAffinity::kNode || o.cpu_affinity == CpuAffinity::kSocket;
  a->worker_cpus =
      WorkerCpus(o.cpu_affinity, cpus, by_topology ? ReadCpuTopology() : CpuTopology{}, nproc);
  return absl::OkStatus();
}

absl::StatusOr<AgentOptions> BuildAgentOptions(const LaunchOptions& o, int nproc,
                                               const std::vector<int>& cpus,
                                               const EnvLookup& env) {
  AgentOptions a;
  a.nproc = nproc;
  SplitSignals(o.signals_to_handle, &a);
  a.grace = o.grace_period;
  a.hang_timeout = o.hang_timeout;
  a.console_prefix_template = o.log_line_prefix_template;
  a.virtual_local_rank = o.virtual_local_rank;
  a.redirects = o.redirects.PerRank(nproc);
  if (absl::Status s = CheckLocalRanks(o, nproc); !s.ok()) return s;
  a.console_ranks = o.local_ranks_filter;
  if (absl::Status s = ApplyEnvironmentRules(o, nproc, cpus, env, &a); !s.ok()) return s;
  a.stdout_pty = isatty(STDOUT_FILENO) == 1;
  a.exit_with_worker_code = o.worker_exit_code;
  a.telemetry.report_json = o.report_json;
  a.telemetry.on = o.telemetry;
  if (o.telemetry_flags.metrics_port >= 0) {
    if (!o.telemetry) {
      return absl::InvalidArgumentError(
          "--metrics-port needs telemetry: drop --telemetry off, or the port");
    }
    a.telemetry.serve_metrics = [port = o.telemetry_flags.metrics_port,
                                 addr = o.telemetry_flags.metrics_addr](
                                    std::shared_ptr<rdzv::JobTelemetry> t) -> std::shared_ptr<void> {
      auto api = LoadRendezvous();  // the HTTP side lives in the plugin, as gRPC does
      if (!api.ok()) {
        spdlog::error("--metrics-port: {}", std::string(api.status().message()));
        return nullptr;
      }
      auto m = (*api)->ServeMetrics(std::move(t), addr, port);
      if (!m.ok()) {
        spdlog::error("--metrics-port: {}; the job goes on without it",
                      std::string(m.status().message()));
        return nullptr;
      }
      return std::shared_ptr<rdzv::MetricsServer>(std::move(*m));
    };
  }
  a.program_name = o.command[0];
  a.hostname = HostName();
  NoteIgnoredFlags(o);
  return a;
}

// Where error files and logs go. --log-dir (or -r/-t without it): a new directory per run,
// torchrun's DIR/<run_id>_<random>/ (with the host name in multi-node jobs, whose nodes may
// share DIR), kept after the run. Else a scratch directory, removed after a success.
absl::StatusOr<std::string> MakeRunDir(const LaunchOptions& o, const std::string& run_id,
                                       const EnvLookup& env, bool* keep) {
  const std::string tmp = env("TMPDIR").value_or("/tmp");
  const bool redirected = o.redirects.Any() || o.tee.Any();
  *keep = !o.log_dir.empty() || redirected;
  if (!*keep) return RunDir(tmp, getuid(), run_id, getpid());
  std::string base = o.log_dir;
  if (base.empty()) base = absl::StrCat(tmp, "/dlrun-", getuid(), "/logs");
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  std::string templ = RunLogDirTemplate(base, run_id, HostName(), o.max_nodes > 1);
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a log directory in '", base,
                                                   "': ", std::strerror(errno)));
  }
  if (o.log_dir.empty()) spdlog::info("worker output is kept in {} (no --log-dir given)", templ);
  return templ;
}

rdzv::TelemetryOptions TelemetryOptionsFrom(const LaunchOptions& o) {
  rdzv::TelemetryOptions t;
  t.straggler_factor = o.telemetry_flags.straggler_factor;
  t.straggler_windows = o.telemetry_flags.straggler_windows;
  t.on_straggler = [](const std::string& line) { spdlog::warn("{}", line); };
  return t;
}

absl::StatusOr<std::unique_ptr<MembershipSource>> RendezvousSource(const LaunchOptions& o,
                                                                   const Detection& d, int nproc,
                                                                   const EnvLookup& env) {
  if (o.rdzv_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv-endpoint is empty: the rendezvous needs HOST[:PORT] (the same on every node)");
  }
  RdzvSourceOptions r;
  auto endpoints = ParseEndpointList(o.rdzv_endpoint);
  if (!endpoints.ok()) return endpoints.status();
  r.endpoint = endpoints->front();
  if (endpoints->size() > 1) r.candidates = *endpoints;
  // The other nodes of the job's node list, where a host may already serve this job.
  const std::string rdzv_port = SplitEndpoint(r.endpoint).second;
  for (const std::string& h : d.expected_hosts) {
    if (r.peers.size() >= rdzv::kMaxSuccessors) break;
    const std::string ep = absl::StrCat(h, ":", rdzv_port);
    if (ep != r.endpoint) r.peers.push_back(ep);
  }
  r.run_id = o.rdzv_id;
  auto token = JobToken(env, o.rdzv_id);
  if (!token.ok()) return token.status();
  r.token = *token;
  auto tls = rdzv::TlsConfigFromEnv();
  if (!tls.ok()) return tls.status();
  r.tls = std::move(*tls);
  r.hostname = HostName();
  const std::string ep_host = SplitEndpoint(r.endpoint).first;
  r.local_addr = !o.local_addr.empty() ? o.local_addr : LocalAddressFor(ep_host);
  if (r.local_addr.empty()) r.local_addr = r.hostname;
  r.nproc = nproc;
  r.slurm_node_id = d.slurm_node_id;
  r.role = o.role;
  r.config.expected_hosts = d.expected_hosts;
  r.config.min_nodes = o.min_nodes;
  r.config.max_nodes = o.max_nodes;
  r.config.max_restarts = o.max_restarts;
  r.telemetry = TelemetryOptionsFrom(o);
  o.rdzv_conf.ApplyTo(&r.config);
  r.is_host = o.rdzv_conf.is_host;
  return MakeRendezvousSource(std::move(r));
}

// The membership source: the gRPC rendezvous, or a static one. `run_id` receives the run id.
absl::StatusOr<std::unique_ptr<MembershipSource>> MakeSource(const LaunchOptions& o,
                                                             const Detection& d, int nproc,
                                                             const EnvLookup& env,
                                                             std::string* run_id) {
  const bool use_rdzv = !o.standalone && o.rdzv_backend != RdzvBackend::kStatic;
  if (!use_rdzv && !o.standalone && o.min_nodes != o.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid value '", o.min_nodes, ":", o.max_nodes,
        "' for --nnodes: the static rendezvous needs a fixed node count N (use --rdzv-backend "
        "c10d for elastic MIN:MAX)"));
  }
  *run_id = o.rdzv_id;
  if (use_rdzv) return RendezvousSource(o, d, nproc, env);
  // The static backend, as torchrun, takes the store's address from --rdzv-endpoint when given
  // (--rdzv-conf was checked with the other flags; its keys set no timeouts here).
  Assignment base = StaticAssignment(o, nproc);
  std::function<int()> pick;
  if (o.standalone) {
    base.master_addr = "127.0.0.1";
    base.run_id = RandomRunId();
    if (!o.master_port_given) {
      // A fresh port per attempt, held (bound, not listening) while that attempt runs.
      auto held = std::make_shared<PortReservation>();
      pick = [held] {
        *held = ReservePort("127.0.0.1");
        return held->port();
      };
    }
  }
  *run_id = base.run_id;
  return MakeStaticSource(base, o.max_restarts, pick, TelemetryOptionsFrom(o));
}

// A rendezvous host whose name does not resolve would be retried for the whole join timeout,
// silently: the first --rdzv-endpoint entry's host must resolve.
absl::Status ResolveRendezvousHost(const LaunchOptions& o) {
  if (o.standalone || o.rdzv_backend == RdzvBackend::kStatic || o.rdzv_endpoint.empty()) {
    return absl::OkStatus();
  }
  auto endpoints = ParseEndpointList(o.rdzv_endpoint);
  if (!endpoints.ok()) return absl::OkStatus();  // MakeSource names the bad entry
  if (absl::Status s = ResolveHost(SplitEndpoint(endpoints->front()).first); !s.ok()) {
    return absl::NotFoundError(
        absl::StrCat("the rendezvous endpoint ", endpoints->front(), ": ", s.message()));
  }
  return absl::OkStatus();
}

// After the run: a kept log directory is named; the scratch directory holds only the workers'
// error files and is kept (and named) only when a failed job left any.
void FinishRunDir(const std::string& run_dir, bool keep, int rc) {
  if (keep) {
    spdlog::info("worker logs are in {}", run_dir);
    return;
  }
  std::error_code ec;
  bool any = false;
  for (auto it = std::filesystem::recursive_directory_iterator(run_dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().filename() == contract::kErrorFileName) any = true;
  }
  if (rc != 0 && any) {
    spdlog::info("worker error files are kept in {}", run_dir);
  } else {
    std::filesystem::remove_all(run_dir, ec);
  }
}

}  // namespace

int LaunchMain(std::vector<std::string> args, bool env_only) {
  const EnvLookup env = ProcessEnv();
  // `dlrun env [options]` and `dlrun --print-completion SHELL` need no program.
  const bool completion = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a.rfind("--print-completion", 0) == 0 || a.rfind("--print_completion", 0) == 0;
  });
  if (env_only || completion) args.push_back("true");
  auto parsed = ParseLaunchOptions(args, env);
  if (!parsed.ok()) return Fail(parsed.status());
  LaunchOptions o = *std::move(parsed);
  if (o.help) return Help(UsageText());
  if (!o.print_completion.empty()) {
    std::fputs(CompletionScript(o.print_completion).c_str(), stdout);
    return 0;
  }
  auto detected = DetectEnvironment(env, &o);
  if (!detected.ok()) return Fail(detected.status());
  if (env_only) {
    std::fputs(FormatDetection(*detected, o).c_str(), stdout);
    return 0;
  }
  // A program that cannot start fails here, once, not as a worker exit restarted --max-restarts
  // times.
  if (absl::Status s = CheckProgram(WorkerArgv(o, env(contract::kPythonExec).value_or("python3")),
                                    RunsPython(o) && !o.module ? o.command[0] : "",
                                    env("PATH").value_or("/usr/local/bin:/usr/bin:/bin"));
      !s.ok()) {
    return Fail(s);
  }
  const std::vector<int> cpus = AllowedCpus();
  auto nproc = ResolveNprocPerNode(o.nproc_per_node, CountGpus(), static_cast<int>(cpus.size()));
  if (!nproc.ok()) return Fail(nproc.status());
  auto agent_options = BuildAgentOptions(o, *nproc, cpus, env);
  if (!agent_options.ok()) return Fail(agent_options.status());
  AgentOptions a = *std::move(agent_options);

  // Block the signals the agent handles before any thread exists (the rendezvous client starts
  // gRPC threads): threads inherit the mask, so SIGCHLD and the handled signals can only be read
  // from the agent's signalfd and are never swallowed by another thread.
  std::vector<int> handled = a.forwarded_signals;
  handled.insert(handled.end(), a.passthrough_signals.begin(), a.passthrough_signals.end());
  auto processes = PosixProcesses::Create(handled);
  if (!processes.ok()) return Fail(processes.status());

  // Not a usage error: DNS may be what is wrong, so exit 1.
  if (absl::Status s = ResolveRendezvousHost(o); !s.ok()) return FailRun(s);
  std::string run_id;
  auto source = MakeSource(o, *detected, *nproc, env, &run_id);
  if (!source.ok()) return Fail(source.status());
  bool keep_run_dir = false;
  auto run_dir_or = MakeRunDir(o, run_id, env, &keep_run_dir);
  if (!run_dir_or.ok()) return Fail(run_dir_or.status());
  a.run_dir = *run_dir_or;
  if (keep_run_dir) a.log_dir = a.run_dir;
  const std::string run_dir = a.run_dir;
  int rc = 0;
  {
    Agent agent(std::move(a), std::move(*source), **processes, SystemClock());
    rc = agent.Run();
  }
  FinishRunDir(run_dir, keep_run_dir, rc);
  return rc;
}

}  // namespace dlrun::launcher
