// The agent's resource sampler (launcher/workers/resource_sampler.h): /proc parsing, a busy child
// measured as busy and an idle one as idle, and NVML through the fake library
// (tests/compat/fake_nvml.c).
#include "launcher/workers/resource_sampler.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "common/contract.h"
#include "common/cpus.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::launcher {
namespace {

TEST(ResourceSampler, ParsesStatWithSpacesAndParenthesesInTheName) {
  const std::string stat =
      "4242 (my (odd) name) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 3 0 1000 "
      "1000000 500 18446744073709551615";
  auto cpu = ParseProcStatCpu(stat, 100);
  ASSERT_TRUE(cpu.has_value());
  EXPECT_DOUBLE_EQ(*cpu, 3.0);  // (250 + 50) ticks at 100 per second
  EXPECT_FALSE(ParseProcStatCpu("4242 (x) R 1", 100).has_value());
  EXPECT_FALSE(ParseProcStatCpu("garbage", 100).has_value());
  EXPECT_FALSE(ParseProcStatCpu("", 100).has_value());
}

TEST(ResourceSampler, ParsesMajorFaultsStorageReadsAndTheState) {
  // majflt 7, cmajflt 5 (fields 12 and 13).
  const std::string stat =
      "4242 (my (odd) name) S 1 4242 4242 0 -1 4194304 100 0 7 5 250 50 0 0 20 0 3 0 1000";
  EXPECT_EQ(ParseProcStatMajorFaults(stat), 7);
  EXPECT_EQ(ParseProcStatMajorFaults(stat, /*with_children=*/true), 12);
  EXPECT_FALSE(ParseProcStatMajorFaults("4242 (x) S 1 2 3").has_value());
  EXPECT_FALSE(ParseProcStatMajorFaults("4242 (x) S 1 2 3 4 5 6 7 8 -9 0").has_value());
  EXPECT_EQ(ParseProcIoReadBytes("rchar: 10\nwchar: 2\nsyscr: 1\nsyscw: 1\nread_bytes: 8192\n"
                                 "write_bytes: 0\ncancelled_write_bytes: 0\n"),
            8192);
  EXPECT_FALSE(ParseProcIoReadBytes("").has_value());  // unreadable (another user's process)
  EXPECT_FALSE(ParseProcIoReadBytes("read_bytes: lots\n").has_value());
  EXPECT_EQ(ParseProcStatState(stat), 'S');
  EXPECT_EQ(ParseProcStatState("4242 (x)"), 0);
}

TEST(ResourceSampler, ParsesStatusMemory) {
  int64_t rss = -1, peak = -1;
  ParseProcStatus("Name:\tpython3\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n", &rss,
                  &peak);
  EXPECT_EQ(rss, 102400LL * 1024);
  EXPECT_EQ(peak, 204800LL * 1024);
  ParseProcStatus("Name:\tzombie\n", &rss, &peak);
  EXPECT_EQ(rss, 0);
  EXPECT_EQ(peak, 0);
}

pid_t Child(bool busy) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (busy) {
      volatile uint64_t spins = 0;
      for (;;) spins = spins + 1;
    }
    pause();
    _exit(0);
  }
  return pid;
}

TEST(ResourceSampler, ABusyWorkerIsBusyAndAnIdleOneIsIdle) {
  const pid_t busy = Child(true), idle = Child(false);
  ResourceSampler s(std::chrono::milliseconds(200));
  s.Watch({busy, idle});
  std::map<pid_t, ProcSample> latest;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  // Wait for the event (two samples of each, so a utilisation), with a deadline.
  while (std::chrono::steady_clock::now() < deadline) {
    latest = s.Latest();
    if (latest.count(busy) && latest[busy].cpu_utilization && latest[busy].cpu_s > 0.3 &&
        latest.count(idle) && latest[idle].cpu_utilization) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(busy, SIGKILL);
  kill(idle, SIGKILL);
  waitpid(busy, nullptr, 0);
  waitpid(idle, nullptr, 0);
  ASSERT_TRUE(latest.count(busy) && latest[busy].cpu_utilization);
  ASSERT_TRUE(latest.count(idle) && latest[idle].cpu_utilization);
  // Two cores shared with whatever else runs (ctest runs up to four tests at once): a spinning
  // child gets a share of a core that depends on the machine's load (0.28 was seen beside three
  // other tests), so busy is only asked to be clearly above idle, and idle near zero.
  EXPECT_GT(*latest[busy].cpu_utilization, 0.1);
  EXPECT_LT(*latest[idle].cpu_utilization, 0.05);
  EXPECT_GT(latest[busy].rss_bytes, 0);
  EXPECT_GE(latest[busy].rss_peak_bytes, latest[busy].rss_bytes);
  EXPECT_EQ(latest[busy].gpu_memory_bytes, -1) << "no NVML here";
}

// What the hang watch must not take for an idle group (chaos on CI: a cold start mapping
// LibTorch from a slow disk used under 0.05 of a core for 8 s and was stopped as hung): a
// process that reads from storage at almost no CPU, and one that wants a CPU and gets none.
TEST(ResourceSampler, StorageReadsAndWaitsForACpuAreWorkOffTheCpu) {
  // A file out of the page cache, which a child maps and touches a page at a time, slowly.
  char path[] = "/var/tmp/dlrun-sampler-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const size_t size = 64 << 20;
  const std::string chunk(1 << 20, 'x');
  for (size_t done = 0; done < size; done += chunk.size()) {
    ASSERT_EQ(write(fd, chunk.data(), chunk.size()), static_cast<ssize_t>(chunk.size()));
  }
  ASSERT_EQ(fsync(fd), 0);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  unlink(path);
  const pid_t reader = fork();
  if (reader == 0) {
    auto* p = static_cast<volatile char*>(mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0));
    if (p == MAP_FAILED) _exit(1);
    madvise(const_cast<char*>(p), size, MADV_RANDOM);  // no readahead: each touch reads
    for (size_t off = 0;; off = (off + (256 << 10)) % size) {
      (void)p[off];
      usleep(20000);
    }
  }
  close(fd);
  // A child at SCHED_IDLE on one CPU beside a spinning one: runnable, and almost never run.
  const int cpu = sched_getcpu() < 0 ? 0 : sched_getcpu();
  auto pinned = [cpu](bool starved) {
    const pid_t pid = fork();
    if (pid == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof set, &set);
      if (starved) {
        sched_param none{};
        sched_setscheduler(0, SCHED_IDLE, &none);
      }
      volatile uint64_t spins = 0;
      for (;;) spins = spins + 1;
    }
    return pid;
  };
  const pid_t hog = pinned(false), starved = pinned(true), idle = Child(false);
  ResourceSampler s(std::chrono::milliseconds(200));
  s.Watch({reader, starved, idle});
  std::map<pid_t, ProcSample> latest;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int samples = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    latest = s.Latest();
    if (latest[reader].read_storage && latest[starved].cpu_utilization &&
        latest[idle].cpu_utilization && ++samples >= 3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (pid_t p : {reader, hog, starved, idle}) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
  EXPECT_TRUE(latest[reader].read_storage);
  EXPECT_GT(latest[reader].major_faults, 0);
  EXPECT_LT(latest[reader].cpu_utilization.value_or(1), 0.05);
  EXPECT_EQ(latest[starved].state, 'R');
  EXPECT_LT(latest[starved].cpu_utilization.value_or(1), 0.05);
  EXPECT_FALSE(latest[idle].read_storage);
  EXPECT_EQ(latest[idle].state, 'S');
  EXPECT_LT(latest[idle].cpu_utilization.value_or(1), 0.05);
}

TEST(ResourceSampler, GpusAndPerProcessMemoryThroughNvml) {
  // The fake NVML answers from FAKE_NVML_GPUS and, per process, from FAKE_NVML_PROCS_FILE.
  const std::string procs = ::testing::TempDir() + "/nvml_procs";
  const pid_t child = Child(false);
  {
    FILE* f = std::fopen(procs.c_str(), "w");
    std::fprintf(f, "1:%d:512\n", child);
    std::fclose(f);
  }
  setenv(contract::kNvmlLibrary, FAKE_NVML_LIB, 1);
  setenv("FAKE_NVML_GPUS", "1000:16000:35,8000:16000:90", 1);
  setenv("FAKE_NVML_PROCS_FILE", procs.c_str(), 1);
  std::vector<telemetry::GpuTelemetry> gpus;
  std::map<pid_t, ProcSample> latest;
  {
    ResourceSampler s(std::chrono::milliseconds(100));
    s.Watch({child});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      gpus = s.Gpus();
      latest = s.Latest();
      if (gpus.size() == 2 && latest.count(child) && latest[child].gpu_memory_bytes >= 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  unsetenv(contract::kNvmlLibrary);
  unsetenv("FAKE_NVML_GPUS");
  unsetenv("FAKE_NVML_PROCS_FILE");
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_DOUBLE_EQ(gpus[0].utilization, 0.35);
  EXPECT_EQ(gpus[1].memory_used_bytes, int64_t{8000} << 20);
  EXPECT_EQ(gpus[1].memory_total_bytes, int64_t{16000} << 20);
  EXPECT_EQ(latest[child].gpu_memory_bytes, int64_t{512} << 20);
}

}  // namespace
}  // namespace dlrun::launcher

namespace dlrun::launcher {
namespace {

// A worker that idles while the process it started (a DataLoader worker) spins: the rank's
// CPU is the child's, counted in the worker's sample.
TEST(ResourceSampler, AWorkersChildProcessesCountInItsCpuAndMemory) {
  const pid_t parent = fork();
  if (parent == 0) {
    Child(true);
    pause();
    _exit(0);
  }
  ResourceSampler s(std::chrono::milliseconds(200));
  s.Watch({parent});
  std::map<pid_t, ProcSample> latest;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    latest = s.Latest();
    if (latest.count(parent) && latest[parent].children == 1 && latest[parent].cpu_utilization &&
        latest[parent].cpu_s > 0.3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::vector<pid_t> kids = Descendants(parent, kMaxSampledChildren);
  for (pid_t k : kids) kill(k, SIGKILL);
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  ASSERT_EQ(kids.size(), 1u);
  ASSERT_TRUE(latest.count(parent));
  EXPECT_EQ(latest[parent].children, 1);
  EXPECT_GT(latest[parent].cpu_s, 0.3);  // the parent itself only waits
  ASSERT_TRUE(latest[parent].cpu_utilization);
  EXPECT_GT(*latest[parent].cpu_utilization, 0.1);  // its child spins: a loaded machine's share
  EXPECT_GE(latest[parent].rss_peak_bytes, latest[parent].rss_bytes);
}

TEST(ResourceSampler, ParsesReapedChildrenTimeAndPss) {
  const std::string stat =
      "4242 (x) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 100 100 20 0 3 0 1000 1000000 500 1";
  auto cpu = ParseProcStatCpu(stat, 100, /*with_children=*/true);
  ASSERT_TRUE(cpu.has_value());
  EXPECT_DOUBLE_EQ(*cpu, 5.0);
  EXPECT_EQ(ParsePss("Rss:  2048 kB\nPss:   1024 kB\n"), 1024 * 1024);
  EXPECT_EQ(ParsePss(""), 0);
  EXPECT_EQ(ParseAnonPss("Pss:   1024 kB\nPss_Anon:   100 kB\nPss_File:   900 kB\n"
                         "Pss_Shmem:  24 kB\n"), 124 * 1024);
  EXPECT_EQ(ParseAnonPss("Pss:   1024 kB\n"), 1024 * 1024);  // no split: all of it
}

// Memory as seff measures it: against Slurm's request when it is the tightest.
TEST(ResourceSampler, TheMemoryAllowanceNamesWhatSetsIt) {
  const int64_t gib = int64_t{1} << 30;
  MemoryAllowance m = MemoryAllowanceOf(24 * gib, 24 * gib, "", "", "");
  EXPECT_EQ(m.bytes, 24 * gib);
  EXPECT_EQ(m.source, "machine memory");
  m = MemoryAllowanceOf(8 * gib, 24 * gib, "", "", "");
  EXPECT_EQ(m.source, "cgroup limit");
  m = MemoryAllowanceOf(8 * gib, 24 * gib, "8192", "", "");  // --mem=8G, enforced by the cgroup
  EXPECT_EQ(m.bytes, 8 * gib);
  EXPECT_EQ(m.source, "Slurm --mem");
  m = MemoryAllowanceOf(24 * gib, 24 * gib, "", "2048", "2");  // --mem-per-cpu=2G on 2 CPUs
  EXPECT_EQ(m.bytes, 4 * gib);
  EXPECT_EQ(m.source, "Slurm --mem");
  m = MemoryAllowanceOf(4 * gib, 24 * gib, "8192", "", "");  // a tighter cgroup wins
  EXPECT_EQ(m.source, "cgroup limit");
}

TEST(ResourceSampler, TheMemoryLimitIsTheTightestCgroupLimitElseTheMachinesMemory) {
  const std::string meminfo = "MemTotal:       24000000 kB\nMemFree:  100 kB\n";
  std::map<std::string, std::string> files = {
      {"/sys/fs/cgroup/slurm/uid_0/job_7/memory.max", "8589934592\n"},
      {"/sys/fs/cgroup/slurm/uid_0/memory.max", "max\n"},
      {"/sys/fs/cgroup/slurm/memory.max", "17179869184\n"}};
  auto read = [&](const std::string& p) {
    auto it = files.find(p);
    return it == files.end() ? std::string() : it->second;
  };
  EXPECT_EQ(MemoryLimitBytes("0::/slurm/uid_0/job_7\n", meminfo, read), int64_t{8} << 30);
  EXPECT_EQ(MemoryLimitBytes("0::/user.slice\n", meminfo, read), int64_t{24000000} * 1024)
      << "no limit set: the machine's memory";
  EXPECT_EQ(MemoryLimitBytes("", "", read), 0);
  EXPECT_GT(MemoryLimitBytes(), 0) << "this machine";
}

// CPUs allocated as seff counts them: the tightest of the affinity mask, a cgroup quota (v2
// cpu.max up the tree, or v1's cfs quota over period) and Slurm's cpus-per-task.
TEST(AllocatedCpus, TheTightestOfAffinityCgroupQuotaAndSlurm) {
  std::map<std::string, std::string> files = {
      {"/sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n"},
      {"/sys/fs/cgroup/kubepods/cpu.max", "150000 100000\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "400000\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"}};
  auto read = [&](const std::string& p) {
    auto it = files.find(p);
    return it == files.end() ? std::string() : it->second;
  };
  CpuAllocation a = AllocatedCpus(16, "0::/kubepods/pod1\n", read, "");
  EXPECT_DOUBLE_EQ(a.cpus, 1.5);  // the parent's quota binds
  EXPECT_EQ(a.source, "cgroup quota");
  a = AllocatedCpus(16, "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n", read, "");
  EXPECT_DOUBLE_EQ(a.cpus, 4);
  EXPECT_EQ(a.source, "cgroup quota");
  a = AllocatedCpus(16, "0::/user.slice\n", read, "8");
  EXPECT_DOUBLE_EQ(a.cpus, 8);
  EXPECT_EQ(a.source, "Slurm cpus-per-task");
  a = AllocatedCpus(2, "0::/user.slice\n", read, "8");
  EXPECT_DOUBLE_EQ(a.cpus, 2);
  EXPECT_EQ(a.source, "affinity mask");
  EXPECT_DOUBLE_EQ(AllocatedCpus(0, "", read, "x").cpus, 0);  // nothing known
  EXPECT_GE(AllocatedCpus().cpus, 1) << "this machine";
}

}  // namespace
}  // namespace dlrun::launcher
