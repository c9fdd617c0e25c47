// The CPUs a process may use, as seff and the DGX guide count them: the tightest of the
// affinity mask, the cgroup's CPU quota (v2 cpu.max or v1 cpu.cfs_quota_us / cfs_period_us, from
// the process' cgroup up to the root) and Slurm's cpus-per-task. No dependencies: the agent's
// report (CPU efficiency) and train_unet's thread budget both use it.
#pragma once

#include <functional>
#include <string>

namespace dlrun {

struct CpuAllocation {
  double cpus = 0;     // may be fractional (a cgroup quota of 1.5 CPUs); 0: unknown
  std::string source;  // "affinity mask", "cgroup quota", "Slurm cpus-per-task"
};

// From explicit inputs (tests): the affinity count, /proc/self/cgroup's text, a file reader
// (empty when absent) and SLURM_CPUS_PER_TASK's value (empty when unset).
CpuAllocation AllocatedCpus(int affinity_cpus, const std::string& proc_cgroup,
                            const std::function<std::string(const std::string&)>& read,
                            const std::string& slurm_cpus_per_task);
// This process'.
CpuAllocation AllocatedCpus();

}  // namespace dlrun
