// What the agent is told (app/launch.cc fills it from the parsed options): the workers'
// command and environment, output, signals, hang detection, the run directory, telemetry and
// the forensics hooks.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/defaults.h"
#include "launcher/base/file_system.h"
#include "launcher/profile/profiler.h"
#include "launcher/stacks/stacks.h"
#include "launcher/workers/agent_telemetry.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/hang_watch.h"

namespace dlrun::launcher {

struct AgentOptions {
  std::vector<std::string> argv;  // what each worker runs (python prefix already applied)
  int nproc = 1;
  Millis grace = defaults::kGracePeriod;  // SIGTERM -> SIGKILL when stopping the group
  // After SIGKILL, how long to wait for a worker to go (one stuck in uninterruptible I/O may
  // never): then the agent names it and goes on without it.
  Millis kill_wait{10000};
  std::vector<int> forwarded_signals;    // stop the job: e.g. SIGTERM, SIGINT, SIGHUP, SIGQUIT
  std::vector<int> passthrough_signals;  // forwarded as-is, the job goes on: SIGUSR1, SIGUSR2
  int omp_threads = 0;                   // > 0: set OMP_NUM_THREADS for workers
  // The run directory (app/run_location.h): error files, and logs when it is kept. A kept one is
  // named at the end; a scratch one is removed, unless a failed run left error files in it.
  std::string run_dir;
  bool keep_run_dir = false;
  // Where the run directory, the error files and --report-json are read and written: the
  // agent touches no file but through it (tests: a MemoryFileSystem).
  FileSystem* file_system = &PosixFileSystem();
  // Where this node goes when its workers fail twice with a hardware fault (root_cause.h
  // HardwareFault): the user's bad-node list and --log-dir's (launcher/base/bad_nodes.h).
  std::vector<std::string> bad_nodes_files;
  // Output: every line is prefixed "[rank N]: " on the console. With log_dir, each worker's
  // streams also go to LOG_DIR/attempt_K/LOCAL_RANK/{stdout,stderr}.log. redirects[lr] are
  // torchrun's 0-3 (1 stdout, 2 stderr, 3 both): redirected streams leave the console.
  // console_ranks (--local-ranks-filter): only these local ranks reach the console.
  std::string log_dir;
  // --log-line-prefix-template: ${role_name}, ${local_rank}, ${rank}, ${hostname}; empty:
  // "[rank N]: ".
  std::string console_prefix_template;
  bool virtual_local_rank = false;  // LOCAL_RANK=0 in every worker (torchrun 2.x)
  std::vector<int> redirects;       // per local rank; empty = 0
  std::vector<int> console_ranks;   // empty = all
  // Hang detection (hang_watch.h): by step records and idle CPU by default; with a timeout, a
  // worker that has sent at least one heartbeat (dlrun::worker::heartbeat() or any byte written
  // to the heartbeat pipe, contract::kHeartbeatFd) and then none for that long is hung too.
  HangOptions hang;
  std::vector<std::vector<int>> worker_cpus;  // per local rank (empty: no pinning)
  std::vector<std::string> gpus;  // one device id per local rank -> CUDA_VISIBLE_DEVICES
  std::map<std::string, std::string> extra_env;  // for every worker (e.g. PYTHONUNBUFFERED=1)
  // Variables of the worker environment that the user already set and that dlrun must not
  // overwrite (e.g. TORCH_NCCL_ASYNC_ERROR_HANDLING).
  std::vector<std::string> keep_inherited;
  bool stdout_pty = false;  // workers' stdout on a pseudo-terminal (dlrun's stdout is one)
  // A warm spare per local rank, started this command (empty: none; SpawnSpec::spare_argv).
  std::vector<std::string> spare_argv;
  // The spare's command held back until the program declares in-process recovery (a Python
  // program with --max-restarts 0: no restart would promote a spare, only a recovery would).
  std::vector<std::string> spare_argv_on_declaration;
  // A Python program's fork server (fork_server.h; --fork-server auto): its command, the warm
  // spare's bootstrap told to serve (empty: none; SpawnSpec::fork_server_argv).
  std::vector<std::string> fork_server_argv;
  // In-process recovery (docs/RECOVERY.md, "A fault costs one step"): when a worker of a
  // program that declared it dies, the survivors keep running, the lost local rank starts again
  // (or a spare takes its place), and the survivors are told the group's next generation on
  // their control pipes. kRestart: always torchrun's stop-all-and-restart. Single-node groups.
  enum class Recovery { kInProcess, kRestart };
  Recovery recovery = Recovery::kInProcess;
  // A recovery that has not ended (every rank's "state from peer" record) within this falls
  // back to the ordinary restart.
  Millis recovery_timeout{60000};
  // A fresh port on the master address (the argument) for a recovery's new group, held until
  // the agent ends; null: no in-process recovery.
  std::function<int(const std::string&)> pick_master_port;
  // --spare-workers auto (not off): a program that declares in-process recovery gets a warm
  // spare per local rank (its own command, held in dlrun::worker::init()) from then on.
  bool spares_on_declaration = true;
  // The job may span one node only (--nnodes 1): in-process recovery applies. An elastic job
  // (--nnodes 1:2) that is down to one node restarts through its rendezvous as before.
  bool single_node_job = true;
  // Exit with the root cause's own code (128+N for a signal) instead of torchrun's 1.
  bool exit_with_worker_code = false;
  std::string program_name = "worker";  // named in the failure block
  std::string hostname;
  TelemetryOptions telemetry;  // this node's figures, the metrics server, the report
  // Capture before kill (docs/STACKS.md): before a group it decided to stop, the agent dumps
  // the workers still alive with dump_stacks (bounded by capture_bound) into the attempt's
  // directory, and says where they were. Empty dump_stacks: never.
  CaptureMode capture_before_kill = CaptureMode::kAuto;
  Millis capture_bound{10000};
  // stacks.h DumpStacks without naming native frames, and SymbolizeStacks (may be empty).
  std::function<std::vector<RankStack>(const std::vector<DumpTarget>&, Millis)> dump_stacks;
  std::function<void(std::vector<RankStack>*)> name_frames;
  // --profile (docs/PROFILING.md): the profiled ranks start as it says and it hears of their
  // starts, steps and ends; the results go in the report at the end of each group, collected
  // within profile_bound. Null: no profiling.
  std::shared_ptr<RankProfiler> profiler;
  // `dlrun profile` on this running job (docs/PROFILING.md): runs the asked tool on the live
  // workers the ask names for its duration (on a thread of its own) and returns the node's
  // answer (launcher/profile/live_profile.h LiveProfilesJson). Empty: answered with no profiles.
  std::function<std::string(const rdzv::ProfileAsk&, const std::vector<DumpTarget>&)> live_profile;
  Millis profile_bound{120000};
};

}  // namespace dlrun::launcher
