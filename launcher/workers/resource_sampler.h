// The agent's resource sampler (docs/TELEMETRY.md): on a thread of its own, off the
// supervision loop, every period it reads each worker's CPU time and resident memory from /proc
// and, when NVML can be loaded (launcher/base/nvml.h), each GPU's
// utilisation and memory and each worker's GPU memory. The loop reads the latest figures.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/base/nvml.h"
#include "telemetry/telemetry.h"

namespace dlrun::launcher {

struct ProcSample {
  double cpu_s = 0;                       // user + system time of the process (all threads)
  std::optional<double> cpu_utilization;  // cores busy over the last period
  int64_t rss_bytes = 0, rss_peak_bytes = 0;
  int64_t gpu_memory_bytes = -1;  // -1: unknown (no NVML, or not on a GPU)
  int children = 0;               // live descendants counted in (DataLoader workers)
  // Work off the CPU, which the hang watch must not take for idleness: page faults that read
  // from storage (a cold start mapping LibTorch from a slow disk) and bytes read from storage,
  // cumulative and whether they rose over the last period; and the main thread's state at the
  // sample ('R' runnable: on a crowded machine, waiting for a CPU it does not get; 'D' in
  // uninterruptible I/O; 'S' asleep, as a rank waiting in a collective is).
  int64_t major_faults = 0, storage_read_bytes = 0;
  bool read_storage = false;
  char state = 0;
};

// The processes a worker started, and theirs, at most `limit` (from /proc/PID/task/*/children).
std::vector<pid_t> Descendants(pid_t pid, size_t limit);
inline constexpr size_t kMaxSampledChildren = 256;
// /proc/<pid>/smaps_rollup's Pss in bytes (0 when absent).
int64_t ParsePss(const std::string& smaps_rollup);
// Its anonymous and shared-memory part (Pss_Anon + Pss_Shmem; Pss where the kernel has no
// split): what a process holds beside the page cache of the libraries it mapped.
int64_t ParseAnonPss(const std::string& smaps_rollup);

// /proc/<pid>/stat's utime + stime in seconds (with `with_children`, plus cutime + cstime: the
// children it has reaped); nullopt if unreadable or malformed.
std::optional<double> ParseProcStatCpu(const std::string& stat, long ticks_per_second,
                                       bool with_children = false);
// /proc/<pid>/stat's major page faults (majflt; with `with_children`, plus cmajflt); nullopt if
// malformed.
std::optional<int64_t> ParseProcStatMajorFaults(const std::string& stat,
                                                bool with_children = false);
// /proc/<pid>/stat's state letter (0 if malformed).
char ParseProcStatState(const std::string& stat);
// /proc/<pid>/io's read_bytes (what the process had read from storage, not the page cache).
std::optional<int64_t> ParseProcIoReadBytes(const std::string& io);
// /proc/<pid>/status' VmRSS and VmHWM in bytes (0 when absent).
void ParseProcStatus(const std::string& status, int64_t* rss, int64_t* peak);
// What this process' workers may use: the cgroup v2 memory.max of the agent's cgroup (a Slurm
// job's or a container's limit) when set, else MemTotal. `proc_cgroup` is /proc/self/cgroup,
// `read` reads a file (empty when absent). 0 when neither is known.
int64_t MemoryLimitBytes(const std::string& proc_cgroup, const std::string& meminfo,
                         const std::function<std::string(const std::string&)>& read);
int64_t MemoryLimitBytes();  // from this machine

// What the workers may use and what says so: Slurm's request (--mem: SLURM_MEM_PER_NODE, or
// SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE, in MiB) when it is the tightest, else the cgroup's
// limit, else the machine's memory.
struct MemoryAllowance {
  int64_t bytes = 0;
  std::string source;  // "Slurm --mem", "cgroup limit", "machine memory"
};
MemoryAllowance MemoryAllowanceOf(int64_t cgroup_or_machine_bytes, int64_t machine_bytes,
                                  const std::string& slurm_mem_per_node,
                                  const std::string& slurm_mem_per_cpu,
                                  const std::string& slurm_cpus_on_node);
MemoryAllowance MemoryAllowanceOfThisMachine();

class ResourceSampler {
 public:
  explicit ResourceSampler(std::chrono::milliseconds period);
  ~ResourceSampler();
  ResourceSampler(const ResourceSampler&) = delete;
  ResourceSampler& operator=(const ResourceSampler&) = delete;

  // The processes to sample from now on (the current workers); of those in `proportional`
  // (the fork server and warm spares, which share most pages with each other and the workers)
  // the memory is their proportional share of anonymous memory (ParseAnonPss), not their RSS:
  // the library pages the server read at its imports are page cache that a cold worker's
  // imports would read as well.
  void Watch(std::vector<pid_t> pids, std::vector<pid_t> proportional = {});
  std::map<pid_t, ProcSample> Latest() const;
  std::vector<telemetry::GpuTelemetry> Gpus() const;

 private:
  void Loop();
  void SampleOnce();

  const std::chrono::milliseconds period_;
  std::unique_ptr<Nvml> nvml_;  // only the sampler thread touches it
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<pid_t> pids_;
  std::vector<pid_t> proportional_;
  std::map<pid_t, ProcSample> latest_;
  std::vector<telemetry::GpuTelemetry> gpus_;
  struct Last {  // the figures at the start of the period
    double cpu_s = 0;
    int64_t major_faults = 0, storage_read_bytes = 0;
    std::chrono::steady_clock::time_point at;
  };
  std::map<pid_t, Last> last_;
  std::map<pid_t, double> cpu_top_;              // the highest cumulative CPU seen per worker
  std::map<pid_t, int64_t> peak_with_children_;  // the worker's peak with its children
  std::thread thread_;
};

}  // namespace dlrun::launcher
