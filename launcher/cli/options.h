// Command-line and environment options of the dlrun agent, torchrun-compatible.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <chrono>

#include "absl/status/statusor.h"
#include "common/defaults.h"
#include "common/env.h"
#include "launcher/cli/flags.h"
#include "launcher/cli/rdzv_conf.h"
#include "launcher/base/capture_mode.h"
#include "launcher/base/preflight.h"
#include "launcher/base/profile_spec.h"

namespace dlrun::launcher {

// Environment variables are looked up through an EnvLookup (common/env.h), so tests need not
// touch the real environment.
inline EnvLookup ProcessEnv() { return ProcessEnvironment(); }

// --cpu-affinity: none (as torchrun), block (a contiguous share each), node (the NUMA nodes,
// round robin), socket (the physical packages, round robin).
enum class CpuAffinity { kNone, kBlock, kNode, kSocket };
// --rdzv-backend: static (torchrun's: fixed node ranks, no rendezvous), or dlrun's gRPC
// rendezvous, which c10d, grpc and dlrun all name.
enum class RdzvBackend { kStatic, kGrpc };
const char* RdzvBackendName(RdzvBackend b);  // "static", "grpc"

// --nproc-per-node: auto (the GPUs, else the CPUs), gpu, cpu, xpu (refused when resolved), or
// a count.
struct NprocSpec {
  enum class Kind { kAuto, kGpu, kCpu, kXpu, kCount } kind = Kind::kCount;
  int count = 1;          // kCount
  std::string text = "1";  // as given, for messages and `dlrun env`
};

// --spare-workers (docs/RECOVERY.md): auto (for Python programs), on (also any other program,
// which waits in dlrun::worker::init()), off.
enum class SpareWorkers { kAuto, kOn, kOff };

// --gpus: CUDA_VISIBLE_DEVICES of each worker. inherit (default, as torchrun: as the scheduler
// set it; "none" too), per-worker (local rank i sees only the i-th visible GPU; "auto" too),
// least-loaded (NVML picks), or device ids.
struct GpuSpec {
  enum class Mode { kInherit, kPerWorker, kLeastLoaded, kIds } mode = Mode::kInherit;
  std::vector<std::string> ids;  // kIds
  std::string text = "inherit";  // as given, for messages
};

// torchrun's --redirects/--tee: 0-3 for every local rank (0 none, 1 stdout, 2 stderr, 3 both),
// or LOCAL_RANK:0-3,... per rank (the others 0).
struct StdSpec {
  int all = 0;
  std::map<int, int> by_rank;
  std::vector<int> PerRank(int nproc) const;  // ranks past nproc are ignored
  bool Any() const;                           // whether any rank's streams go to files
};

struct LaunchOptions : cli::CommandLine {  // command: PROGRAM ARGS...
  int min_nodes = 1;
  int max_nodes = 1;
  NprocSpec nproc_per_node;
  bool standalone = false;
  RdzvBackend rdzv_backend = RdzvBackend::kStatic;
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  RdzvConf rdzv_conf;  // --rdzv-conf, parsed (cli/rdzv_conf.h)
  int max_restarts = 0;
  std::chrono::milliseconds monitor_interval{100};  // torchrun's; dlrun sees exits at once
  std::string role = "default";
  bool no_python = false;
  bool module = false;
  bool run_path = false;
  std::string log_dir;
  StdSpec redirects, tee;
  // --local-ranks-filter: only these local ranks' output on the console (empty: all); checked
  // against the worker count once it is known (CheckLocalRanks).
  std::vector<int> local_ranks_filter;
  std::string local_ranks_filter_text;  // as given, for messages
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = defaults::kMasterPort;
  bool master_port_given = false;
  std::string local_addr;
  std::vector<int> signals_to_handle;  // parsed --signals-to-handle (default TERM,INT,HUP,QUIT)
  std::string signals_to_handle_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";  // as given
  bool signals_to_handle_given = false;  // --signals-to-handle on the command line
  std::chrono::milliseconds grace_period = defaults::kGracePeriod;  // SIGTERM -> SIGKILL
  std::chrono::milliseconds hang_timeout{0};      // 0: off
  bool hang_detect = true;                        // --hang-detect on|off
  std::chrono::milliseconds hang_floor = defaults::kHangStepFloor;  // --hang-floor
  CaptureMode capture_before_kill = CaptureMode::kAuto;  // --capture-before-kill
  // --preflight (launcher/base/preflight.h); unset: quick for a multi-node job, off on one node.
  std::optional<PreflightMode> preflight;
  // --profile, --profile-ranks, --profile-steps, --profile-args (docs/PROFILING.md).
  ProfileSpec profile;
  GpuSpec gpus;
  CpuAffinity cpu_affinity = CpuAffinity::kNone;  // CPU pinning; --numa-binding maps here too
  // torchrun flags that have no effect here (a one-line note says so when given).
  std::string start_method = "spawn";
  std::string logs_specs, event_log_handler;
  std::string duplicate_stdout_filters, duplicate_stderr_filters;
  // torchrun 2.x: the console prefix of each worker line, with ${role_name}, ${local_rank},
  // ${rank} and ${hostname} (default: dlrun's "[rank N]: ").
  std::string log_line_prefix_template;
  // torchrun 2.x: LOCAL_RANK is 0 in every worker and each sees only its own GPU (as device 0).
  bool virtual_local_rank = false;
  std::string print_completion;  // bash | zsh | tcsh: print a completion script and exit
  bool worker_exit_code = false;  // exit with the root cause's code instead of torchrun's 1
  std::string report_json;        // --report-json: this node's end-of-job report as JSON
  SpareWorkers spare_workers = SpareWorkers::kAuto;  // warm spares
  bool fork_server = true;  // --fork-server auto|off: a Python program's ready processes
  std::string recovery = "in-process";  // --recovery: in-process or restart
  std::chrono::milliseconds recovery_timeout{60000};
  // Job telemetry (docs/TELEMETRY.md): sampling, step records, stragglers, the report ("on",
  // default) or nothing but the step records' counts ("off"); HTTP only with --metrics-port.
  bool telemetry = true;
  cli::TelemetryFlags telemetry_flags;
  std::set<std::string> given;  // canonical names of flags set on the command line or by PET_*
};

// Parses `dlrun [options] PROGRAM [ARGS...]` (args excludes argv[0]). Flags are accepted with
// '-' or '_' between words and as `--flag value` or `--flag=value`; a flag not given falls back
// to PET_<FLAG> in the environment, as torchrun does. Errors name the flag and what it accepts.
// env_only: `dlrun env [options]`, where PROGRAM is optional (as with --print-completion).
absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env, bool env_only = false);

// --print-completion: a completion script for `shell` (bash, zsh or tcsh) listing dlrun's flags.
std::string CompletionScript(const std::string& shell);

// --nproc-per-node's value, parsed (the count checked: 1-4096).
absl::StatusOr<NprocSpec> ParseNprocPerNode(const std::string& value);

std::string UsageText();

// torchrun's per-rank stream spec ("3", or "0:1,2:3") as a value 0-3 for each local rank.


}  // namespace dlrun::launcher
