// Figures both the end-of-job report and its JSON derive from the snapshot: the slowest rank,
// the GPUs' and the CPUs' use (internal to telemetry/).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "telemetry/telemetry.h"

namespace dlrun::telemetry {

// Each GPU's utilisation averaged over the job's stepping time (the last sample when none was
// taken while stepping): their mean and the least-used GPU's; the peak memory of the fullest.
struct GpuSummary {
  double mean = -1, min = 2, mem_peak = 0, mem_total = 0;
  int count = 0;
  // The DGX guide's figure: the GPUs the same work needs at 90% utilisation (at least 1).
  int NeededAt90() const {
    return std::max(1, static_cast<int>(std::ceil(count * mean / 0.9 - 1e-9)));
  }
};
GpuSummary SummariseGpus(const std::vector<GpuTelemetry>& gpus);

// The job's CPUs as seff counts them: the CPU seconds of every rank (its DataLoader workers
// included) over the wall time times the CPUs allocated, on the nodes that said how many.
struct CpuSummary {
  double allocated = 0, used_s = 0, core_walltime_s = 0;
  std::string source;  // the first node's (e.g. "Slurm cpus-per-task")
  int nodes = 0;
  double efficiency() const { return core_walltime_s > 0 ? used_s / core_walltime_s : -1; }
};
CpuSummary SummariseCpus(const JobTelemetry::Snapshot& s);

// The slowest rank: in synchronous DDP every step lasts as long as the slowest rank's, so with
// the split it is the one with the most work before the sync; else the longest median step.
// `what` says which figure it is. Ranks without step records are never it; -1 when none has any.
int SlowestRank(const std::map<int, RankTelemetry>& ranks, double* figure, std::string* what);

}  // namespace dlrun::telemetry
