// What a worker tells its agent. No LibTorch here.
#pragma once

#include <limits>
#include <string>

namespace dlrun::worker {

// Tells the dlrun agent this worker is making progress (its --hang-timeout clock restarts).
// Cheap and non-blocking; call it once per training step. A no-op outside dlrun.
void heartbeat();

// One training step, for dlrun's telemetry (docs/TELEMETRY.md). Negative values are left out.
struct StepReport {
  long long step = 0;
  long long samples = 0;  // samples this rank processed in the step
  double step_s = 0;      // the step's wall time
  double data_s = -1;     // of which waiting for data
  double compute_s = -1;  // forward + backward before the gradient sync
  double sync_s = -1;     // waiting inside the gradient sync
  double loss = std::numeric_limits<double>::quiet_NaN();  // NaN: not reported
};

// Sends `r` to the dlrun agent as one step record on the heartbeat pipe (it also counts as a
// heartbeat). Cheap and non-blocking; a no-op outside dlrun.
void report_step(const StepReport& r);

// Tells the dlrun agent that this attempt resumed from the checkpoint of `step`, and that
// loading it took `load_s` seconds: the restart ledger (docs/TELEMETRY.md, "Time lost to
// restarts") then counts the load, and the steps after `step` that were computed again.
// CheckpointManager::resume_latest() calls it; a trainer with its own checkpoints calls it once
// after loading one. A no-op outside dlrun.
void report_resume(long long step, double load_s);

// Tells the dlrun agent that this rank's work is done (call it last, after the final
// checkpoint): a death by a signal after it, in the process's teardown, counts as a finish with
// a warning, not a failure (docs/USAGE.md, "Done"). A no-op outside dlrun.
void report_done();

// Declares work that is not a training step (an evaluation, a checkpoint save), so the
// agent's hang detection does not count it (docs/USAGE.md, "Hangs"): while an object lives, the
// rank's missing step records are no hang. `what`: one word, e.g. "eval". A no-op outside dlrun.
//   { dlrun::worker::HangPause pause("eval"); evaluate(); }
class HangPause {
 public:
  explicit HangPause(const char* what);
  ~HangPause();
  HangPause(const HangPause&) = delete;
  HangPause& operator=(const HangPause&) = delete;
};

// In-process recovery (dlrun/recovery.h, docs/RECOVERY.md): tells the dlrun agent that this
// worker can survive a peer's loss (a step record "C recovery"), and, after one, that it took
// (or sent) the state of `step` from a peer in `seconds` ("P <step> <seconds>", the restart
// ledger's "state from peer" phase). dlrun::worker::Recovery calls both. No-ops outside dlrun.
void declare_in_process_recovery();
void report_state_from_peer(long long step, double seconds);

// On a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL), writes the crashing thread's native
// frames to stderr (module+offset and the symbol where the module exports one) before the
// default action, so dlrun's failure report names the frame it died in (docs/STACKS.md,
// "Crashes"). Leaves alone a signal that already has a handler. init() calls it unless
// InitOptions::crash_trace is false or DLRUN_CRASH_TRACE=0 is in the environment (then it does
// nothing). Returns whether it installed any handler.
bool install_crash_trace();

// Warm spares (docs/RECOVERY.md): when this process was started as a spare
// (DLRUN_SPARE_FD is set), blocks until the agent promotes it, then replaces the whole
// environment with the one the agent sent (RANK, WORLD_SIZE, MASTER_ADDR, ... of the new
// attempt) and returns true. A spare that is not needed gets end of file and exits 0 here.
// Returns false at once in an ordinary worker. init() calls it first, so a program that reads
// no rank variable before init() can run as a spare (`dlrun --spare-workers on`).
bool await_promotion();

// Writes the torchelastic error file ($TORCHELASTIC_ERROR_FILE) with `message`, so dlrun (or
// torchrun) names it as the root cause. A no-op when the variable is unset.
void record_error(const std::string& message);

// Makes glibc's malloc keep freed memory for reuse instead of handing it back to the kernel:
// no mmap for large blocks, no trimming of the heap. A training step frees and re-allocates the
// same large activation and im2col buffers every step; by default each of them is a fresh
// mmap whose pages the kernel must fault in and zero again (on the U-Net at width 16 that was
// ~30% of a CPU step). The process keeps its peak heap instead. Called by init() unless
// InitOptions::keep_freed_memory is false, DLRUN_KEEP_FREED_MEMORY=0 is in the environment, or
// the user set any MALLOC_*_ tunable (theirs wins). Returns whether it changed anything.
bool keep_freed_memory();

// Preemption under Slurm: true when the job script asked for a requeue after a signal
// checkpoint (`dlrun slurm --preemptible` exports DLRUN_REQUEUE_ON_SIGNAL=1) and this is a
// Slurm job.
bool requeue_on_signal_requested();

// Runs `scontrol requeue $SLURM_JOB_ID` (call it on one rank, after the checkpoint is written).
// Returns an empty string on success, else what went wrong in one line.
std::string requeue_slurm_job();

}  // namespace dlrun::worker
