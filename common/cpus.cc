#include "common/cpus.h"

#include <sched.h>

#include <cstdlib>
#include <sstream>
#include <vector>

#include "common/files.h"
#include "common/scheduler_env.h"

namespace dlrun {
namespace {

// "quota period" (v2's cpu.max; "max" is no limit) -> CPUs, or 0.
double QuotaCpus(const std::string& quota, const std::string& period) {
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || q <= 0) return 0;
  const double p = std::strtod(period.c_str(), &end);
  if (end == period.c_str() || p <= 0) return 0;
  return q / p;
}

}  // namespace

CpuAllocation AllocatedCpus(int affinity_cpus, const std::string& proc_cgroup,
                            const std::function<std::string(const std::string&)>& read,
                            const std::string& slurm_cpus_per_task) {
  CpuAllocation best;
  auto offer = [&](double cpus, const char* source) {
    if (cpus > 0 && (best.cpus == 0 || cpus < best.cpus)) best = {cpus, source};
  };
  offer(affinity_cpus, "affinity mask");
  for (const CgroupEntry& e : ParseProcCgroup(proc_cgroup)) {
    if (e.v2()) {
      for (const std::string& p : CgroupAncestry(e.path)) {
        std::istringstream max(read("/sys/fs/cgroup" + p + "/cpu.max"));
        std::string quota, period;
        if (max >> quota >> period && quota != "max") offer(QuotaCpus(quota, period), "cgroup quota");
      }
    } else if (e.Has("cpu")) {  // v1's cpu controller
      for (const std::string& dir : {std::string("/sys/fs/cgroup/cpu,cpuacct"),
                                     std::string("/sys/fs/cgroup/cpu")}) {
        for (const std::string& p : CgroupAncestry(e.path)) {
          offer(QuotaCpus(read(dir + p + "/cpu.cfs_quota_us"), read(dir + p + "/cpu.cfs_period_us")),
                "cgroup quota");
        }
      }
    }
  }
  char* end = nullptr;
  const long per_task = std::strtol(slurm_cpus_per_task.c_str(), &end, 10);
  if (end != slurm_cpus_per_task.c_str() && per_task > 0) {
    offer(static_cast<double>(per_task), "Slurm cpus-per-task");
  }
  return best;
}

CpuAllocation AllocatedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  const char* slurm = std::getenv(sched::kSlurmCpusPerTask);
  return AllocatedCpus(affinity, ReadWholeFile("/proc/self/cgroup"), ReadWholeFile,
                       slurm ? slurm : "");
}

}  // namespace dlrun
