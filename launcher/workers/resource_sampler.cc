#include "launcher/workers/resource_sampler.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/scheduler_env.h"
#include "launcher/base/nvml.h"

namespace dlrun::launcher {

namespace {

// The value of the first "Key:  N kB" line of a /proc file, in bytes.
std::optional<int64_t> KbField(const std::string& text, absl::string_view key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, key)) continue;
    std::vector<std::string> f =
        absl::StrSplit(line.substr(key.size()), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t kb = 0;
    if (!f.empty() && absl::SimpleAtoi(f[0], &kb)) return kb * 1024;
  }
  return std::nullopt;
}

}  // namespace

namespace {

// The sum of /proc/<pid>/stat's fields `first` to `last`, counted after the state (the first
// field after the name), or nullopt if one is missing or not a count. "pid (comm) state ppid
// ...": comm may hold spaces and parentheses, so the fields resume after the last ')'.
std::optional<uint64_t> SumStatFields(const std::string& stat, size_t first, size_t last) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  if (f.size() <= last) return std::nullopt;
  uint64_t sum = 0;
  for (size_t i = first; i <= last; ++i) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(f[i], &v)) return std::nullopt;
    sum += v;
  }
  return sum;
}

}  // namespace

std::optional<double> ParseProcStatCpu(const std::string& stat, long ticks_per_second,
                                       bool with_children) {
  // utime, stime, cutime and cstime are fields 14 to 17 (11 to 14 after the state).
  if (ticks_per_second <= 0) return std::nullopt;
  const std::optional<uint64_t> ticks = SumStatFields(stat, 11, with_children ? 14 : 12);
  if (!ticks) return std::nullopt;
  return static_cast<double>(*ticks) / static_cast<double>(ticks_per_second);
}

std::optional<int64_t> ParseProcStatMajorFaults(const std::string& stat, bool with_children) {
  // majflt and cmajflt are fields 12 and 13 (9 and 10 after the state).
  const std::optional<uint64_t> faults = SumStatFields(stat, 9, with_children ? 10 : 9);
  if (!faults) return std::nullopt;
  return static_cast<int64_t>(*faults);
}

std::optional<int64_t> ParseProcIoReadBytes(const std::string& io) {
  std::istringstream in(io);
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "read_bytes:")) continue;
    int64_t v = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(11)), &v) && v >= 0) return v;
    return std::nullopt;
  }
  return std::nullopt;
}

char ParseProcStatState(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

int64_t ParsePss(const std::string& smaps_rollup) {
  return KbField(smaps_rollup, "Pss:").value_or(0);
}

int64_t ParseAnonPss(const std::string& smaps_rollup) {
  auto anon = KbField(smaps_rollup, "Pss_Anon:");
  if (!anon) return ParsePss(smaps_rollup);  // a kernel before 5.7
  return *anon + KbField(smaps_rollup, "Pss_Shmem:").value_or(0);
}

void ParseProcStatus(const std::string& status, int64_t* rss, int64_t* peak) {
  *rss = KbField(status, "VmRSS:").value_or(0);
  *peak = KbField(status, "VmHWM:").value_or(0);
}

std::vector<pid_t> Descendants(pid_t pid, size_t limit) {
  std::vector<pid_t> out;
  std::vector<pid_t> todo{pid};
  while (!todo.empty() && out.size() < limit) {
    const pid_t p = todo.back();
    todo.pop_back();
    std::error_code ec;
    const std::string tasks = "/proc/" + std::to_string(p) + "/task";
    for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
      std::istringstream in(ReadWholeFile(t.path().string() + "/children"));
      for (pid_t c = 0; in >> c && out.size() < limit;) {
        out.push_back(c);
        todo.push_back(c);
      }
    }
  }
  return out;
}

int64_t MemoryLimitBytes(const std::string& proc_cgroup, const std::string& meminfo,
                         const std::function<std::string(const std::string&)>& read) {
  const int64_t total = KbField(meminfo, "MemTotal:").value_or(0);
  // cgroup v2: "0::/path"; the limit is the tightest memory.max from there up to the root.
  std::string path, line;
  std::istringstream cg(proc_cgroup);
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  int64_t limit = total;
  for (const std::string& p : CgroupAncestry(path)) {
    std::string v = read("/sys/fs/cgroup" + p + "/memory.max");
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    int64_t bytes = 0;
    if (absl::SimpleAtoi(v, &bytes) && bytes > 0)
      limit = limit > 0 ? std::min(limit, bytes) : bytes;
  }
  return limit;
}

namespace {

// /proc/meminfo, or where /proc cannot be read (a chroot without it) its MemTotal line from
// sysconf, which asks the kernel (sysinfo) without /proc.
std::string Meminfo() {
  std::string meminfo = ReadWholeFile("/proc/meminfo");
  if (meminfo.empty()) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      meminfo = "MemTotal: " + std::to_string(static_cast<int64_t>(pages) * page / 1024) + " kB\n";
    }
  }
  return meminfo;
}

}  // namespace

int64_t MemoryLimitBytes() {
  return MemoryLimitBytes(ReadWholeFile("/proc/self/cgroup"), Meminfo(), ReadWholeFile);
}

MemoryAllowance MemoryAllowanceOf(int64_t cgroup_or_machine_bytes, int64_t machine_bytes,
                                  const std::string& slurm_mem_per_node,
                                  const std::string& slurm_mem_per_cpu,
                                  const std::string& slurm_cpus_on_node) {
  MemoryAllowance m{cgroup_or_machine_bytes,
                    cgroup_or_machine_bytes > 0 && cgroup_or_machine_bytes < machine_bytes
                        ? "cgroup limit"
                        : "machine memory"};
  int64_t mib = 0, per_cpu = 0, cpus = 0;
  if (!absl::SimpleAtoi(slurm_mem_per_node, &mib) &&
      absl::SimpleAtoi(slurm_mem_per_cpu, &per_cpu) &&
      absl::SimpleAtoi(slurm_cpus_on_node, &cpus)) {
    mib = per_cpu * cpus;
  }
  // The request is what the job asked for: it is named even when the cgroup enforces the same.
  if (mib > 0 && (m.bytes <= 0 || (mib << 20) <= m.bytes)) m = {mib << 20, "Slurm --mem"};
  return m;
}

MemoryAllowance MemoryAllowanceOfThisMachine() {
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  const std::string meminfo = Meminfo();
  const int64_t machine = KbField(meminfo, "MemTotal:").value_or(0);
  const int64_t limit =
      MemoryLimitBytes(ReadWholeFile("/proc/self/cgroup"), meminfo, ReadWholeFile);
  return MemoryAllowanceOf(limit, machine, env(sched::kSlurmMemPerNode),
                           env(sched::kSlurmMemPerCpu), env(sched::kSlurmCpusOnNode));
}

namespace {

// Adds one process's counters to `s`: its CPU time (with that of the children it reaped), its
// major faults and its storage reads. Its state letter, or nullopt when it is gone.
std::optional<char> AddCounters(const std::string& dir, long ticks, ProcSample* s) {
  const std::string stat = ReadWholeFile(dir + "/stat");
  const std::optional<double> cpu = ParseProcStatCpu(stat, ticks, /*with_children=*/true);
  if (!cpu) return std::nullopt;
  s->cpu_s += *cpu;
  s->major_faults += ParseProcStatMajorFaults(stat, /*with_children=*/true).value_or(0);
  s->storage_read_bytes += ParseProcIoReadBytes(ReadWholeFile(dir + "/io")).value_or(0);
  return ParseProcStatState(stat);
}

// The processes `pid` started, and theirs (DataLoader workers): their counters and their
// proportional share of memory (Pss) added to the worker's sample.
void AddDescendants(pid_t pid, long ticks, ProcSample* s) {
  for (pid_t c : Descendants(pid, kMaxSampledChildren)) {
    const std::string dir = "/proc/" + std::to_string(c);
    AddCounters(dir, ticks, s);
    s->rss_bytes += ParsePss(ReadWholeFile(dir + "/smaps_rollup"));
    ++s->children;
  }
}

// The worker with the processes it started (a DataLoader's workers): their CPU time (and that
// of children already reaped), their faults and storage reads, and their proportional share of
// memory (forked workers share most pages with the worker, which their RSS would count again);
// with `proportional`, the worker's own share too. Nullopt when it is gone.
std::optional<ProcSample> ReadProcess(pid_t pid, long ticks, bool proportional) {
  const std::string dir = "/proc/" + std::to_string(pid);
  ProcSample s;
  const std::optional<char> state = AddCounters(dir, ticks, &s);
  if (!state) return std::nullopt;
  s.state = *state;
  if (proportional) {
    s.rss_bytes = ParseAnonPss(ReadWholeFile(dir + "/smaps_rollup"));
  } else {
    ParseProcStatus(ReadWholeFile(dir + "/status"), &s.rss_bytes, &s.rss_peak_bytes);
  }
  AddDescendants(pid, ticks, &s);
  return s;
}

}  // namespace

ResourceSampler::ResourceSampler(std::chrono::milliseconds period)
    : period_(period), thread_([this] { Loop(); }) {}

ResourceSampler::~ResourceSampler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ResourceSampler::Watch(std::vector<pid_t> pids, std::vector<pid_t> proportional) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pids_ = std::move(pids);
    proportional_ = std::move(proportional);
  }
  cv_.notify_all();  // sample the new workers at once
}

std::map<pid_t, ProcSample> ResourceSampler::Latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

std::vector<telemetry::GpuTelemetry> ResourceSampler::Gpus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gpus_;
}

void ResourceSampler::Loop() {
  nvml_ = Nvml::Load();  // here, not in the constructor: dlopen and nvmlInit cost the launch
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    SampleOnce();
    lock.lock();
    const std::vector<pid_t> seen = pids_;
    cv_.wait_for(lock, period_, [&] { return stop_ || pids_ != seen; });
  }
}

void ResourceSampler::SampleOnce() {
  std::vector<pid_t> pids, proportional;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pids = pids_;
    proportional = proportional_;
  }
  static const long ticks = sysconf(_SC_CLK_TCK);
  const auto now = std::chrono::steady_clock::now();
  std::map<pid_t, ProcSample> out;
  for (pid_t pid : pids) {
    std::optional<ProcSample> read = ReadProcess(
        pid, ticks, std::find(proportional.begin(), proportional.end(), pid) != proportional.end());
    if (!read) continue;  // gone
    ProcSample& s = *read;
    auto& peak = peak_with_children_[pid];
    peak = std::max({peak, s.rss_bytes, s.rss_peak_bytes});
    s.rss_peak_bytes = peak;
    // A child that exits takes its time out of the sum until the worker reaps it: the
    // cumulative figure never goes back.
    auto& top = cpu_top_[pid];
    top = std::max(top, s.cpu_s);
    s.cpu_s = top;
    const Last here{s.cpu_s, s.major_faults, s.storage_read_bytes, now};
    auto it = last_.find(pid);
    if (it != last_.end()) {
      const Last& was = it->second;
      const double dt = std::chrono::duration<double>(now - was.at).count();
      if (dt > 0.05) {
        s.cpu_utilization = std::max(0.0, (s.cpu_s - was.cpu_s) / dt);
        // A child that exits takes its faults and reads with it: only a rise counts.
        s.read_storage =
            s.major_faults > was.major_faults || s.storage_read_bytes > was.storage_read_bytes;
        it->second = here;
      } else {
        auto prev = latest_.find(pid);
        if (prev != latest_.end()) {
          s.cpu_utilization = prev->second.cpu_utilization;
          s.read_storage = prev->second.read_storage;
        }
      }
    } else {
      last_[pid] = here;
    }
    out[pid] = std::move(s);
  }
  for (auto it = last_.begin(); it != last_.end();) {
    it = out.count(it->first) ? std::next(it) : last_.erase(it);
  }
  for (auto it = cpu_top_.begin(); it != cpu_top_.end();) {
    it = out.count(it->first) ? std::next(it) : cpu_top_.erase(it);
  }
  for (auto it = peak_with_children_.begin(); it != peak_with_children_.end();) {
    it = out.count(it->first) ? std::next(it) : peak_with_children_.erase(it);
  }
  std::vector<telemetry::GpuTelemetry> gpus;
  const auto queried =
      nvml_ ? nvml_->Query(telemetry::kMaxTelemetryGpus, /*with_processes=*/true) : std::nullopt;
  for (const NvmlGpu& n : queried.value_or(std::vector<NvmlGpu>{})) {
    telemetry::GpuTelemetry g;
    g.index = n.index;
    if (n.memory_used && n.memory_total) {
      g.memory_used_bytes = static_cast<int64_t>(*n.memory_used);
      g.memory_total_bytes = static_cast<int64_t>(*n.memory_total);
    }
    if (n.utilization) g.utilization = std::min(100u, *n.utilization) / 100.0;
    gpus.push_back(g);
    for (const auto& [pid, bytes] : n.processes) {
      auto p = out.find(pid);
      if (p == out.end()) continue;
      p->second.gpu_memory_bytes =
          std::max<int64_t>(0, p->second.gpu_memory_bytes) + static_cast<int64_t>(bytes);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = std::move(out);
  gpus_ = std::move(gpus);
}

}  // namespace dlrun::launcher
