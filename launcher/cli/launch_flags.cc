#include "launcher/cli/launch_flags.h"

#include <signal.h>

#include <limits>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/defaults.h"

namespace dlrun::launcher {
namespace {

using cli::BadValue;
using Flag = cli::Flag<LaunchOptions>;
using O = LaunchOptions;

absl::StatusOr<StdSpec> ParseStd(const std::string& flag, const std::string& v) {
  const std::string expected = "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or RANK:0-3,...";
  StdSpec spec;
  int x = 0;
  if (absl::SimpleAtoi(v, &x)) {
    if (x < 0 || x > 3) return BadValue(flag, v, expected);
    spec.all = x;
    return spec;
  }
  for (absl::string_view item : absl::StrSplit(v, ',')) {
    std::vector<std::string> kv = absl::StrSplit(item, ':');
    int r = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &r) || r < 0 || !absl::SimpleAtoi(kv[1], &x) ||
        x < 0 || x > 3) {
      return BadValue(flag, v, expected);
    }
    spec.by_rank[r] = x;
  }
  return spec;
}

cli::Setter<O> StdField(const std::string& flag, StdSpec O::*field) {
  return [=](O& o, const std::string& v) {
    auto s = ParseStd(flag, v);
    if (!s.ok()) return s.status();
    o.*field = *std::move(s);
    return absl::OkStatus();
  };
}

absl::Status SetLocalRanksFilter(O& o, const std::string& v) {
  std::vector<int> ranks;
  for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipEmpty())) {
    int r = 0;
    if (!absl::SimpleAtoi(item, &r) || r < 0) {
      return BadValue("local-ranks-filter", v, "comma-separated local ranks (e.g. 0,1)");
    }
    ranks.push_back(r);
  }
  o.local_ranks_filter = std::move(ranks);
  o.local_ranks_filter_text = v;
  return absl::OkStatus();
}

absl::Status SetNnodes(O& o, const std::string& v) {
  auto r = cli::ParseNodeRange("nnodes", v);
  if (!r.ok()) return r.status();
  o.min_nodes = r->min;
  o.max_nodes = r->max;
  return absl::OkStatus();
}

absl::Status SetNproc(O& o, const std::string& v) {
  auto n = ParseNprocPerNode(v);
  if (!n.ok()) return n.status();
  o.nproc_per_node = *std::move(n);
  return absl::OkStatus();
}

absl::Status SetBackend(O& o, const std::string& v) {
  if (v == "etcd" || v == "etcd-v2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rdzv-backend ", v, " is not supported: dlrun brings its own rendezvous, with nothing "
        "to run beside it; use --rdzv-backend c10d (or grpc) and the same --rdzv-endpoint "
        "HOST:PORT on every node"));
  }
  if (v != "static" && v != "c10d" && v != "grpc" && v != "dlrun") {
    return BadValue("rdzv-backend", v, "static, c10d, grpc or dlrun");
  }
  o.rdzv_backend = v == "static" ? RdzvBackend::kStatic : RdzvBackend::kGrpc;
  return absl::OkStatus();
}

absl::Status SetMasterPort(O& o, const std::string& v) {
  auto n = cli::ParseInt("master-port", v, 0, 65535);
  if (!n.ok()) return BadValue("master-port", v, "a port number 0-65535");
  o.master_port = *n;
  o.master_port_given = true;
  return absl::OkStatus();
}

absl::Status SetGpus(O& o, const std::string& v) {
  using M = GpuSpec::Mode;
  GpuSpec g;
  g.text = v;
  if (v == "inherit" || v == "none") {
    g.mode = M::kInherit;
  } else if (v == "per-worker" || v == "auto") {
    g.mode = M::kPerWorker;
  } else if (v == "least-loaded") {
    g.mode = M::kLeastLoaded;
  } else if (!v.empty() && v.find_first_not_of("0123456789,") == std::string::npos) {
    g.mode = M::kIds;
    g.ids = absl::StrSplit(v, ',', absl::SkipEmpty());
  } else {
    return BadValue("gpus", v, "inherit, per-worker, least-loaded or device ids 0,1,...");
  }
  o.gpus = std::move(g);
  return absl::OkStatus();
}

absl::Status SetCpuAffinity(O& o, const std::string& v) {
  static const std::map<std::string, CpuAffinity> kModes = {{"none", CpuAffinity::kNone},
                                                            {"block", CpuAffinity::kBlock},
                                                            {"node", CpuAffinity::kNode},
                                                            {"socket", CpuAffinity::kSocket}};
  auto it = kModes.find(v);
  if (it == kModes.end()) return BadValue("cpu-affinity", v, "none, block, node or socket");
  o.cpu_affinity = it->second;
  return absl::OkStatus();
}

// torchrun 2.x's --numa-binding: node and socket as here; exclusive (CPUs of one's own) is
// dlrun's block; core-complex (L3 groups) is approximated by node.
absl::Status SetNumaBinding(O& o, const std::string& v) {
  if (v == "node" || v == "core-complex") {
    o.cpu_affinity = CpuAffinity::kNode;
  } else if (v == "socket") {
    o.cpu_affinity = CpuAffinity::kSocket;
  } else if (v == "exclusive") {
    o.cpu_affinity = CpuAffinity::kBlock;
  } else {
    return BadValue("numa-binding", v, "node, socket, exclusive or core-complex");
  }
  return absl::OkStatus();
}

// A flag whose value is one of a few words, each setting `field` to its value.
template <typename T>
cli::Setter<O> WordField(const char* flag, T O::*field, std::vector<std::pair<std::string, T>> words,
                         const char* expected) {
  return [=](O& o, const std::string& v) {
    for (const auto& [word, value] : words) {
      if (v == word) return (o.*field = value, absl::OkStatus());
    }
    return BadValue(flag, v, expected);
  };
}

absl::Status SetSignals(O& o, const std::string& v) {
  auto s = cli::ParseSignalList("signals-to-handle", v);
  if (!s.ok()) return s.status();
  o.signals_to_handle = *s;
  o.signals_to_handle_text = v;
  o.signals_to_handle_given = true;
  return absl::OkStatus();
}

using cli::BoolField;
using cli::DurationField;
using cli::IntField;
using cli::StrField;
constexpr int kMax = std::numeric_limits<int>::max();

// dlrun's own flags, torchrun's first (LaunchFlags() adds the telemetry ones).
const std::vector<Flag> kBaseFlags = {
    {"nnodes", "", true, SetNnodes, "N or MIN:MAX nodes (default 1:1)"},
    {"nproc-per-node", "", true, SetNproc, "workers per node: auto | gpu | cpu | xpu | N (default 1)"},
    {"standalone", "", false, BoolField(&O::standalone),
     "single node, local rendezvous on a free port"},
    {"rdzv-backend", "", true, SetBackend,
     "static (fixed node ranks) or c10d/grpc (dlrun's gRPC rendezvous)"},
    {"rdzv-endpoint", "", true, StrField(&O::rdzv_endpoint), "HOST[:PORT] of the rendezvous"},
    {"rdzv-id", "", true, StrField(&O::rdzv_id), "run id shared by all nodes of the job"},
    {"rdzv-conf", "", true,
     [](O& o, const std::string& v) {
       auto c = ParseRdzvConf(v);
       if (!c.ok()) return c.status();
       o.rdzv_conf = *std::move(c);
       return absl::OkStatus();
     },
     "KEY=VALUE,... rendezvous settings"},
    {"max-restarts", "", true, IntField("max-restarts", &O::max_restarts, 0, kMax),
     "restarts of the worker group before the job fails (default 0; a restart in place of a "
     "refused in-process recovery is not counted)"},
    {"monitor-interval", "", true, DurationField("monitor-interval", &O::monitor_interval, true),
     "accepted for torchrun compatibility; dlrun sees worker exits at once"},
    {"role", "", true, StrField(&O::role), "worker role name (default 'default')"},
    {"no-python", "", false, BoolField(&O::no_python),
     "run PROGRAM directly even if it is a .py file"},
    {"module", "m", false, BoolField(&O::module), "run PROGRAM as 'python3 -m PROGRAM'"},
    {"run-path", "", false, BoolField(&O::run_path), "accepted; same as default"},
    {"log-dir", "", true, StrField(&O::log_dir), "directory for per-rank logs"},
    {"redirects", "r", true, StdField("redirects", &O::redirects),
     "redirect worker streams to --log-dir files: 0 none, 1 stdout, 2 stderr, 3 both; "
     "LOCAL_RANK:N,... per rank (e.g. 0:3,1:1)"},
    {"tee", "t", true, StdField("tee", &O::tee),
     "tee worker streams to --log-dir files and the console: 0 none, 1 stdout, 2 stderr, "
     "3 both; LOCAL_RANK:N,... per rank"},
    {"local-ranks-filter", "", true, SetLocalRanksFilter,
     "only show output of these local ranks (e.g. 0,1)"},
    {"node-rank", "", true, IntField("node-rank", &O::node_rank, 0, kMax),
     "rank of this node (static rendezvous)"},
    {"master-addr", "", true, StrField(&O::master_addr), "address of node rank 0 (static)"},
    {"master-port", "", true, SetMasterPort,
     absl::StrCat("port of the c10d store on node rank 0 (static; default ", defaults::kMasterPort, ")")},
    {"local-addr", "", true, StrField(&O::local_addr), "address of this node"},
    {"signals-to-handle", "", true, SetSignals,
     "signals forwarded to workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT, and SIGUSR1 "
     "under Slurm: its preemption warning; SIGUSR1/SIGUSR2 are passed on without stopping "
     "the job)"},
    {"hang-timeout", "", true, DurationField("hang-timeout", &O::hang_timeout, true),
     "stop and restart a worker whose heartbeats (dlrun::worker::heartbeat(), step records) "
     "stop this long, or a group of programs that never heartbeat when every rank is idle "
     "that long (0: off)"},
    {"hang-detect", "", true,
     [](O& o, const std::string& v) {
       if (v != "on" && v != "off") return cli::BadValue("hang-detect", v, "on or off");
       o.hang_detect = v == "on";
       return absl::OkStatus();
     },
     absl::StrCat("on (default): a rank that sends step records and has not finished one for ",
                  defaults::kHangStepFactor, " x its p99 step gap (at least --hang-floor) is "
                  "stopped, named from every rank's stack, and restarted; a group idle ",
                  defaults::kHangIdleBound.count() / 1000, " s gets one line saying where every "
                  "rank is; off: only --hang-timeout")},
    {"preflight", "", true,
     [](O& o, const std::string& v) {
       auto m = ParsePreflightMode(v);
       if (m.ok()) o.preflight = *m;
       return m.status();
     },
     "off|quick|full: check this node before it joins (GPU health, disk space, a compute probe "
     "the rendezvous compares across the round); default quick for multi-node jobs, else off"},
    {"hang-floor", "", true, DurationField("hang-floor", &O::hang_floor, false),
     absl::StrCat("the least time without a step record before a rank counts as hung (default ",
                  defaults::kHangStepFloor.count() / 1000, ")")},
    {"capture-before-kill", "", true,
     [](O& o, const std::string& v) {
       auto m = ParseCaptureMode(v);
       if (!m.ok()) return cli::BadValue("capture-before-kill", v, "auto, always or off");
       o.capture_before_kill = *m;
       return absl::OkStatus();
     },
     "dump the live workers' stacks before a failed group is stopped: auto (default: after a "
     "hang, a crash by signal, a collective timeout or a lost peer), always, off"},
    {"profile", "", true,
     [](O& o, const std::string& v) {
       auto t = ParseProfileTool(v);
       if (!t.ok()) return t.status();
       o.profile.tool = *t;
       return absl::OkStatus();
     },
     "profile the --profile-ranks with nsys, py-spy, perf or torch (the PyTorch profiler, "
     "for Python programs that import dlrun_report): one file per rank in the run's "
     "profile/ directory, named in the report (docs/PROFILING.md)"},
    {"profile-ranks", "", true,
     [](O& o, const std::string& v) {
       auto r = ParseRankList("profile-ranks", v);
       if (!r.ok()) return r.status();
       o.profile.ranks = *std::move(r);
       return absl::OkStatus();
     },
     "the global ranks to profile, e.g. 1 or 0,4-5 (the others start as without --profile)"},
    {"profile-steps", "", true,
     [](O& o, const std::string& v) {
       auto r = ParseStepRange(v);
       if (!r.ok()) return r.status();
       o.profile.steps = *r;
       return absl::OkStatus();
     },
     "A:B: capture only steps A to B, as the program's step records number them"},
    {"profile-args", "", true,
     [](O& o, const std::string& v) {
       auto r = SplitProfileArgs(v);
       if (!r.ok()) return r.status();
       o.profile.args = *std::move(r);
       return absl::OkStatus();
     },
     "more arguments for the profiler, e.g. \"--rate 200\" (py-spy) or \"-F 499\" (perf)"},
    {"grace-period", "", true, DurationField("grace-period", &O::grace_period, true),
     absl::StrCat("seconds between SIGTERM and SIGKILL when stopping workers (default ",
                  defaults::kGracePeriod.count() / 1000, ")")},
    {"shutdown-timeout", "", true, DurationField("shutdown-timeout", &O::grace_period, true),
     "torchrun 2.x's name for --grace-period"},
    {"log-line-prefix-template", "", true, StrField(&O::log_line_prefix_template),
     "console prefix of worker lines with ${role_name}, ${local_rank}, ${rank}, ${hostname} "
     "(default '[rank ${rank}]: ')"},
    {"virtual-local-rank", "", false, BoolField(&O::virtual_local_rank),
     "LOCAL_RANK=0 in every worker, each seeing only its own GPU (implies --gpus per-worker)"},
    {"duplicate-stdout-filters", "", true, StrField(&O::duplicate_stdout_filters),
     "torchrun 2.x: accepted, no effect (grep the --log-dir files)"},
    {"duplicate-stderr-filters", "", true, StrField(&O::duplicate_stderr_filters),
     "torchrun 2.x: accepted, no effect (grep the --log-dir files)"},
    {"print-completion", "", true,
     WordField<std::string>("print-completion", &O::print_completion,
                            {{"bash", "bash"}, {"zsh", "zsh"}, {"tcsh", "tcsh"}}, "bash, zsh or tcsh"),
     "print a shell completion script (bash, zsh or tcsh) for dlrun's flags and exit"},
    {"gpus", "", true, SetGpus,
     "inherit (default: CUDA_VISIBLE_DEVICES as set), per-worker (local rank i sees only the "
     "i-th visible GPU, as device 0), least-loaded (NVML picks), or device ids 0,1,..."},
    {"cpu-affinity", "", true, SetCpuAffinity,
     "none (default), block (a contiguous share of the CPUs each), node or socket (workers "
     "round robin over NUMA nodes or sockets)"},
    {"numa-binding", "", true, SetNumaBinding,
     "torchrun 2.x: node, socket, exclusive (= --cpu-affinity block), core-complex (~ node)"},
    {"start-method", "", true,
     WordField<std::string>("start-method", &O::start_method,
                            {{"spawn", "spawn"}, {"fork", "fork"}, {"forkserver", "forkserver"}},
                            "spawn, fork or forkserver"),
     "torchrun's spawn|fork|forkserver: accepted, no effect (dlrun starts processes itself)"},
    {"logs-specs", "", true, StrField(&O::logs_specs),
     "torchrun's LogsSpecs plug-in: accepted, no effect (dlrun's layout is torchrun's default)"},
    {"event-log-handler", "", true, StrField(&O::event_log_handler),
     "torchrun's event log handler: accepted, no effect"},
    {"report-json", "", true, StrField(&O::report_json),
     "write the end-of-job report (the job's on the rendezvous host or a single node, else "
     "this node's) to this file as JSON"},
    {"spare-workers", "", true,
     WordField("spare-workers", &O::spare_workers,
               {{"auto", SpareWorkers::kAuto}, {"on", SpareWorkers::kOn}, {"off", SpareWorkers::kOff}},
               "auto, on or off"),
     "auto (default): without a fork server (--fork-server off), a Python worker that fails is "
     "replaced by a warm spare that has already imported torch; on: spares beside the fork "
     "server too, and for other programs, held in dlrun::worker::init() (they must read no "
     "rank variable before it); off: none"},
    {"fork-server", "", true,
     WordField("fork-server", &O::fork_server, {{"auto", true}, {"off", false}}, "auto or off"),
     "auto (default): a Python program's workers, spares and replacements are forked from one "
     "interpreter per node that imported torch once (a few ms each, at any load); off: each "
     "starts its own interpreter"},
    {"recovery", "", true,
     WordField<std::string>("recovery", &O::recovery,
                            {{"in-process", "in-process"}, {"restart", "restart"}},
                            "in-process or restart"),
     "in-process (default): when a worker of a program that declared it (dlrun::worker::Recovery) "
     "dies, the others keep running and the lost rank takes the state from a peer; restart: "
     "always stop and restart the whole group, as torchrun (docs/RECOVERY.md)"},
    {"recovery-timeout", "", true, DurationField("recovery-timeout", &O::recovery_timeout, false),
     "seconds an in-process recovery may take before dlrun restarts the group from the "
     "checkpoint instead (default 60)"},
    {"worker-exit-code", "", false, BoolField(&O::worker_exit_code),
     "exit with the failing worker's own code (128+N for a signal) instead of torchrun's 1"},
};

}  // namespace

std::vector<cli::Flag<LaunchOptions>> LaunchFlags() {
  std::vector<Flag> f = kBaseFlags;
  f.push_back({"telemetry", "", true,
               WordField("telemetry", &O::telemetry, {{"on", true}, {"off", false}}, "on or off"),
               "on (default): sample each worker's CPU and memory (and GPUs through NVML), "
               "aggregate step records job-wide, name stragglers, print the end-of-job report; "
               "off: none of it"});
  cli::AddTelemetryFlags(&O::telemetry_flags, &f);
  return f;
}

}  // namespace dlrun::launcher
