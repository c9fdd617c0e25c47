// What a worker tells its agent. No LibTorch here.
#pragma once

#include <string>

namespace dlrun::worker {

// Tells the dlrun agent this worker is making progress (its --hang-timeout clock restarts).
// Cheap and non-blocking; call it once per training step. A no-op outside dlrun.
void heartbeat();

// Writes the torchelastic error file ($TORCHELASTIC_ERROR_FILE) with `message`, so dlrun (or
// torchrun) names it as the root cause. A no-op when the variable is unset.
void recordError(const std::string& message);

// Preemption under Slurm: true when the job script asked for a requeue after a signal
// checkpoint (`dlrun slurm --preemptible` exports DLRUN_REQUEUE_ON_SIGNAL=1) and this is a
// Slurm job.
bool requeueOnSignalRequested();

// Runs `scontrol requeue $SLURM_JOB_ID` (call it on one rank, after the checkpoint is written).
// Returns an empty string on success, else what went wrong in one line.
std::string requeueSlurmJob();

}  // namespace dlrun::worker
