// The launch plan: the decisions `dlrun PROGRAM` makes from its options and the machine
// (which GPUs each worker sees, what each worker runs, thread counts, signals, where error
// files go), as pure functions, so unit tests reach every rule without starting anything.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/agent/agent.h"
#include "launcher/app/worker_program.h"
#include "launcher/cli/options.h"
#include "launcher/detect/gpu_pick.h"
#include "launcher/detect/machine.h"

namespace dlrun::launcher {

// What `dlrun PROGRAM` decides before it starts anything.
struct LaunchPlan {
  int nproc = 1;       // workers on this node
  std::string run_id;  // --rdzv-id, or a fresh one for a standalone job
  // All but what needs the run directory (its path, the profiler, the spares' argv file) and
  // the backend (the metrics server): app/launch.cc adds those once they exist.
  AgentOptions agent;
  std::string profile_tool;  // --profile's executable (profiler.h FindProfileTool)
  // Set by PlanPreflight: the preflight the rendezvous runs before its first join (unset: off),
  // and the bad-node lists this node goes into.
  std::function<absl::StatusOr<double>()> preflight;
  std::vector<std::string> bad_nodes_files;
};
// The plan for options `o` on machine `m`: the program is checked (one clear error, not a worker
// exit restarted --max-restarts times), the worker count resolved, the flags dlrun takes without
// acting on them named (one info line each).
absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchOptions& o, const Machine& m,
                                      const EnvLookup& env);
// The preflight this node runs before it joins (--preflight; app/node_main.cc), and the
// bad-node lists: a failed check records the node as bad and is a FAILED_PRECONDITION naming
// it; else the compute probe's figure goes with the join.
void PlanPreflight(const LaunchOptions& o, const std::string& hostname, LaunchPlan* plan);

// --nproc-per-node as a count, given the machine's GPUs and CPUs.
absl::StatusOr<int> ResolveNprocPerNode(const NprocSpec& spec, int num_gpus, int num_cpus);
// --local-ranks-filter against the worker count: an error names a rank >= nproc.
absl::Status CheckLocalRanks(const LaunchOptions& o, int nproc);

// The device id each worker gets in CUDA_VISIBLE_DEVICES; empty: every worker inherits it.
// "inherit" (the default, as torchrun; also "none"): nothing changes, so LOCAL_RANK is the
// device index. Opt-ins, after which the device index inside each worker is 0:
// "per-worker" (also "auto"): local rank i sees only the i-th visible GPU (the inherited
// CUDA_VISIBLE_DEVICES, else /dev/nvidiaN order), when there is one per worker (else nothing
// changes); "least-loaded": the nproc GPUs with the least memory used and utilisation (NVML;
// without NVML as per-worker); "0,3,...": these ids, at least one per worker.
absl::StatusOr<std::vector<std::string>> ResolveGpus(const GpuSpec& spec, int nproc,
                                                     const GpuFacts& facts);

// OMP_NUM_THREADS for the workers: 0 (leave it) when the user set it or with one worker (as
// torchrun), else CPUs / workers (torchrun: 1; more is faster and never oversubscribes).
int OmpThreads(bool user_set, int ncpus, int nproc);

// The CPUs each worker is pinned to (--cpu-affinity): none -> no pinning (empty); block -> a
// contiguous share of `allowed` each (none when there are fewer CPUs than workers); node /
// socket -> worker i gets the allowed CPUs of group i mod G (G = the groups with allowed CPUs).
std::vector<std::vector<int>> WorkerCpus(CpuAffinity mode, const std::vector<int>& allowed,
                                         const CpuTopology& topology, int nproc);

// Splits --signals-to-handle: SIGUSR1/SIGUSR2 carry messages (e.g. Slurm's preemption warning)
// and are passed on with the job running; the others stop the job.
void SplitSignals(const std::vector<int>& handled, AgentOptions* a);

// The signals dlrun handles: --signals-to-handle as given, else its default, with SIGUSR1 added
// under Slurm (SLURM_JOB_ID set): `--signal=USR1@90` is Slurm's preemption warning, and SIGUSR1's
// default action would end dlrun (rc 138) before the program could checkpoint. The text is the
// same list, for the workers' environment (TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun 2.x).
std::vector<int> HandledSignals(const LaunchOptions& o, const EnvLookup& env);
std::string HandledSignalsText(const LaunchOptions& o, const EnvLookup& env);

// Static rendezvous (--rdzv-backend static, or standalone): the fixed assignment; as torchrun,
// --rdzv-endpoint HOST[:PORT], when given, is the store's address instead of --master-addr/port.
Assignment StaticAssignment(const LaunchOptions& o, int nproc);

}  // namespace dlrun::launcher
