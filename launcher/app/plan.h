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

// The device id each worker gets in CUDA_VISIBLE_DEVICES ("none": no narrowing). "auto" gives
// local rank i the i-th visible GPU (respecting an inherited CUDA_VISIBLE_DEVICES, else the
// least loaded by NVML, else /dev/nvidiaN order) when there is one per worker, and nothing
// (a CPU run) otherwise; explicit ids need at least one per worker.
absl::StatusOr<std::vector<std::string>> ResolveGpus(const std::string& spec, int nproc,
                                                     const GpuFacts& facts);

// What each worker runs: torchrun runs .py files and -m modules with the Python interpreter.
std::vector<std::string> WorkerArgv(const LaunchOptions& o);

// OMP_NUM_THREADS for the workers: 0 (leave it) when the user set it, else CPUs / workers.
int OmpThreads(bool user_set, int ncpus, int nproc);

// Splits --signals-to-handle: SIGUSR1/SIGUSR2 carry messages (e.g. Slurm's preemption warning)
// and are passed on with the job running; the others stop the job.
void SplitSignals(const std::vector<int>& handled, AgentOptions* a);

// The per-run scratch directory for error files: TMPDIR/dlrun-UID/RUNID-PID.
std::string RunDir(const std::string& tmpdir, unsigned uid, const std::string& run_id, int pid);

// Static rendezvous (--rdzv-backend static, or standalone): the fixed assignment.
Assignment StaticAssignment(const LaunchOptions& o, int nproc);

}  // namespace dlrun::launcher
