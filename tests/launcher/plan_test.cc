// The launch plan: GPU choice (least-loaded picking, inherited CUDA_VISIBLE_DEVICES), what each
// worker runs, OMP threads, signals, the run directory.
#include "launcher/app/plan.h"

#include <signal.h>

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

TEST(GpuPick, LeastLoadedByMemoryAndUtilisation) {
  std::vector<GpuLoad> g = {{0, 30, 100, 50},   // 30% memory + 50% busy = 80
                            {1, 0, 100, 0},     // idle
                            {2, 90, 100, 90},   // 180
                            {3, 10, 100, 5}};   // 15
  EXPECT_EQ(PickLeastLoaded(g, 2), (std::vector<int>{1, 3}));
  EXPECT_EQ(PickLeastLoaded(g, 3), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(PickLeastLoaded(g, 9).size(), 4u);
}

TEST(ResolveGpus, AutoFollowsTheSchedulerThenNvmlThenDeviceOrder) {
  GpuFacts f;
  f.visible_devices = "3,1,2";
  f.loads = std::vector<GpuLoad>{{0, 90, 100, 90}, {1, 0, 100, 0}};
  EXPECT_EQ(*ResolveGpus("auto", 2, f), (std::vector<std::string>{"3", "1"}));  // scheduler's
  f.visible_devices.reset();
  EXPECT_EQ(*ResolveGpus("auto", 1, f), std::vector<std::string>{"1"});  // least loaded
  f.loads.reset();
  f.device_count = 4;
  EXPECT_EQ(*ResolveGpus("auto", 2, f), (std::vector<std::string>{"0", "1"}));
  f.device_count = 1;
  EXPECT_TRUE(ResolveGpus("auto", 2, f)->empty());  // fewer GPUs than workers: a CPU run
  EXPECT_TRUE(ResolveGpus("none", 2, f)->empty());
  EXPECT_EQ(*ResolveGpus("5,6,7", 2, f), (std::vector<std::string>{"5", "6"}));
  EXPECT_EQ(std::string(ResolveGpus("5", 2, f).status().message()),
            "invalid value '5' for --gpus: expected at least 2 device ids (one per worker), auto "
            "or none");
}

TEST(Plan, PythonProgramsRunUnderTheInterpreter) {
  LaunchOptions o;
  o.command = {"train.py", "--lr", "1"};
  EXPECT_EQ(WorkerArgv(o), (std::vector<std::string>{"python3", "-u", "train.py", "--lr", "1"}));
  o.no_python = true;
  EXPECT_EQ(WorkerArgv(o), o.command);
  o.no_python = false;
  o.module = true;
  o.command = {"pkg.mod"};
  EXPECT_EQ(WorkerArgv(o), (std::vector<std::string>{"python3", "-m", "pkg.mod"}));
  o.module = false;
  o.command = {"./train"};
  EXPECT_EQ(WorkerArgv(o), o.command);
}

TEST(Plan, ThreadsSignalsRunDirAndStaticAssignment) {
  EXPECT_EQ(OmpThreads(false, 8, 3), 2);
  EXPECT_EQ(OmpThreads(false, 2, 4), 1);
  EXPECT_EQ(OmpThreads(true, 8, 2), 0);  // the user's value is kept
  AgentOptions a;
  SplitSignals({SIGTERM, SIGUSR1, SIGINT, SIGUSR2}, &a);
  EXPECT_EQ(a.forwarded_signals, (std::vector<int>{SIGTERM, SIGINT}));
  EXPECT_EQ(a.passthrough_signals, (std::vector<int>{SIGUSR1, SIGUSR2}));
  EXPECT_EQ(RunDir("/scratch", 1000, "job", 42), "/scratch/dlrun-1000/job-42");
  EXPECT_EQ(RunDir("", 0, "j", 1), "/tmp/dlrun-0/j-1");
  LaunchOptions o;
  o.max_nodes = 3;
  o.node_rank = 2;
  o.max_restarts = 4;
  const Assignment s = StaticAssignment(o, 4);
  EXPECT_EQ(s.rank_offset, 8);
  EXPECT_EQ(s.world_size, 12);
  EXPECT_EQ(s.num_nodes, 3);
  EXPECT_EQ(s.max_restarts, 4);
}

}  // namespace
}  // namespace dlrun::launcher
