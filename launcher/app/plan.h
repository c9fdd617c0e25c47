// The launch plan: the decisions `dlrun PROGRAM` makes from its options and the machine
// (which GPUs each worker sees, what each worker runs, thread counts, signals, where error
// files go), as pure functions, so unit tests reach every rule without starting anything.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/agent/agent.h"
#include "launcher/cli/options.h"
#include "launcher/detect/gpu_pick.h"

namespace dlrun::launcher {

// What the machine says about its GPUs.
struct GpuFacts {
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES as inherited
  std::optional<std::vector<GpuLoad>> loads;   // NVML, when it loads
  int device_count = 0;                        // /dev/nvidiaN
};

// The device id each worker gets in CUDA_VISIBLE_DEVICES; empty: every worker inherits it.
// "inherit" (the default, as torchrun; also "none"): nothing changes, so LOCAL_RANK is the
// device index. Opt-ins, after which the device index inside each worker is 0:
// "per-worker" (also "auto"): local rank i sees only the i-th visible GPU (the inherited
// CUDA_VISIBLE_DEVICES, else /dev/nvidiaN order), when there is one per worker (else nothing
// changes); "least-loaded": the nproc GPUs with the least memory used and utilisation (NVML;
// without NVML as per-worker); "0,3,...": these ids, at least one per worker.
absl::StatusOr<std::vector<std::string>> ResolveGpus(const GpuSpec& spec, int nproc,
                                                     const GpuFacts& facts);

// What each worker runs: torchrun runs .py files and -m modules with `python` ($PYTHON_EXEC,
// else python3 on PATH) and -u (unbuffered).
std::vector<std::string> WorkerArgv(const LaunchOptions& o, const std::string& python);
// Whether workers run under the Python interpreter (they then get PYTHONUNBUFFERED=1).
bool RunsPython(const LaunchOptions& o);

// A warm spare's command for a worker running `argv` (docs/RECOVERY.md), or empty when there is
// none: only for `python[X.Y] [flags] SCRIPT ARGS` and `python [flags] -m MODULE ARGS`. The
// spare is the same interpreter with the same flags, running a small bootstrap (-c) that imports
// torch ahead of need, then waits on kSpareFd for the worker's environment and runs the script or
// module as __main__ with the same arguments.
std::vector<std::string> WarmSpareArgv(const std::vector<std::string>& argv);

// OMP_NUM_THREADS for the workers: 0 (leave it) when the user set it or with one worker (as
// torchrun), else CPUs / workers (torchrun: 1; more is faster and never oversubscribes).
int OmpThreads(bool user_set, int ncpus, int nproc);

// The machine's CPU groups, from sysfs (`root` is /sys; tests pass a fake tree).
struct CpuTopology {
  std::vector<std::vector<int>> numa_nodes;  // /sys/devices/system/node/nodeN/cpulist
  std::vector<std::vector<int>> sockets;     // by .../cpuN/topology/physical_package_id
};
CpuTopology ReadCpuTopology(const std::string& root = "/sys");
// A Linux CPU list ("0-3,8,10-11") as numbers; empty on a malformed list.
std::vector<int> ParseCpuList(const std::string& list);

// The CPUs each worker is pinned to (--cpu-affinity): none -> no pinning (empty); block -> a
// contiguous share of `allowed` each (none when there are fewer CPUs than workers); node /
// socket -> worker i gets the allowed CPUs of group i mod G (G = the groups with allowed CPUs).
std::vector<std::vector<int>> WorkerCpus(CpuAffinity mode, const std::vector<int>& allowed,
                                         const CpuTopology& topology, int nproc);

// Splits --signals-to-handle: SIGUSR1/SIGUSR2 carry messages (e.g. Slurm's preemption warning)
// and are passed on with the job running; the others stop the job.
void SplitSignals(const std::vector<int>& handled, AgentOptions* a);

// The per-run scratch directory for error files: TMPDIR/dlrun-UID/RUNID-PID.
std::string RunDir(const std::string& tmpdir, unsigned uid, const std::string& run_id, int pid);

// The mkdtemp template of a run's log directory: torchrun's DIR/<run_id>_<random>, with the
// host name before the random part in multi-node jobs (their nodes may share DIR).
std::string RunLogDirTemplate(const std::string& log_dir, const std::string& run_id,
                              const std::string& hostname, bool multinode);

// Static rendezvous (--rdzv-backend static, or standalone): the fixed assignment; as torchrun,
// --rdzv-endpoint HOST[:PORT], when given, is the store's address instead of --master-addr/port.
Assignment StaticAssignment(const LaunchOptions& o, int nproc);

// The directory of dlrun's Python helper (dlrun_report.py) for the dlrun at `exe`:
// EXE_DIR/../share/dlrun/python, installed and in the build tree alike; empty when it is not there.
std::string PythonHelperDir(const std::string& exe);

// Before any worker starts: the worker program (argv[0], searched in `path` as execvp does)
// exists and may be executed, and the Python script, when there is one, may be read. The error
// names the program and the reason (not found, permission denied).
absl::Status CheckProgram(const std::vector<std::string>& argv, const std::string& script,
                          const std::string& path);

}  // namespace dlrun::launcher
