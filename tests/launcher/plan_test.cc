// The launch plan: GPU choice (least-loaded picking, inherited CUDA_VISIBLE_DEVICES), what each
// worker runs, OMP threads, signals, the run directory.
#include "launcher/app/plan.h"
#include "launcher/app/run_location.h"

#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <optional>
#include <fstream>
#include <iterator>

#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::launcher {
namespace {

// --gpus VALUE as the command line parses it.
GpuSpec Gpus(const std::string& value) {
  auto o = ParseLaunchOptions({"--gpus", value, "prog"},
                              [](std::string_view) { return std::optional<std::string>(); });
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? o->gpus : GpuSpec{};
}

TEST(GpuPick, LeastLoadedByMemoryAndUtilisation) {
  std::vector<GpuLoad> g = {{0, 30, 100, 50},   // 30% memory + 50% busy = 80
                            {1, 0, 100, 0},     // idle
                            {2, 90, 100, 90},   // 180
                            {3, 10, 100, 5}};   // 15
  EXPECT_EQ(PickLeastLoaded(g, 2), (std::vector<int>{1, 3}));
  EXPECT_EQ(PickLeastLoaded(g, 3), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(PickLeastLoaded(g, 9).size(), 4u);
}

TEST(ResolveGpus, TheDefaultLeavesCudaVisibleDevicesAsTheSchedulerSetIt) {
  GpuFacts f;
  f.visible_devices = "0,1,2,3";
  f.device_count = 4;
  // As torchrun: every worker inherits CUDA_VISIBLE_DEVICES, so set_device(LOCAL_RANK) works.
  EXPECT_TRUE(ResolveGpus(Gpus("inherit"), 4, f)->empty());
  EXPECT_TRUE(ResolveGpus(Gpus("none"), 4, f)->empty());
}

TEST(ResolveGpus, OptInsNarrowEachWorkerToOneDevice) {
  GpuFacts f;
  f.visible_devices = "3,1,2";
  f.loads = std::vector<GpuLoad>{{0, 90, 100, 90}, {1, 0, 100, 0}};
  EXPECT_EQ(*ResolveGpus(Gpus("per-worker"), 2, f), (std::vector<std::string>{"3", "1"}));
  EXPECT_EQ(*ResolveGpus(Gpus("auto"), 2, f), (std::vector<std::string>{"3", "1"}));
  EXPECT_EQ(*ResolveGpus(Gpus("least-loaded"), 1, f), std::vector<std::string>{"1"});  // NVML
  f.visible_devices.reset();
  f.loads.reset();
  f.device_count = 4;
  EXPECT_EQ(*ResolveGpus(Gpus("least-loaded"), 2, f), (std::vector<std::string>{"0", "1"}));  // no NVML
  EXPECT_EQ(*ResolveGpus(Gpus("per-worker"), 2, f), (std::vector<std::string>{"0", "1"}));
  f.device_count = 1;
  EXPECT_TRUE(ResolveGpus(Gpus("per-worker"), 2, f)->empty());  // fewer GPUs than workers
  EXPECT_EQ(*ResolveGpus(Gpus("5,6,7"), 2, f), (std::vector<std::string>{"5", "6"}));
  EXPECT_EQ(std::string(ResolveGpus(Gpus("5"), 2, f).status().message()),
            "invalid value '5' for --gpus: expected at least 2 device ids (one per worker), "
            "inherit, per-worker or least-loaded");
}

TEST(CpuAffinity, NoneByDefaultBlockNodeAndSocketOnAFakeSysfs) {
  const std::string root = dlrun::testing::MakeTempDir("sysfs");
  // Two NUMA nodes (0-3, 4-7) on two sockets, CPU 7 not allowed to this process.
  for (int n = 0; n < 2; ++n) {
    const std::string d = root + "/devices/system/node/node" + std::to_string(n);
    std::filesystem::create_directories(d);
    std::ofstream(d + "/cpulist") << (n == 0 ? "0-3\n" : "4-7\n");
  }
  for (int c = 0; c < 8; ++c) {
    const std::string d = root + "/devices/system/cpu/cpu" + std::to_string(c) + "/topology";
    std::filesystem::create_directories(d);
    std::ofstream(d + "/physical_package_id") << c / 4 << "\n";
  }
  const CpuTopology t = ReadCpuTopology(root);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  ASSERT_EQ(t.sockets.size(), 2u);
  EXPECT_EQ(t.sockets[1], (std::vector<int>{4, 5, 6, 7}));
  const std::vector<int> allowed = {0, 1, 2, 3, 4, 5, 6};
  EXPECT_TRUE(WorkerCpus(CpuAffinity::kNone, allowed, t, 2).empty());
  EXPECT_EQ(WorkerCpus(CpuAffinity::kBlock, allowed, t, 2),
            (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(WorkerCpus(CpuAffinity::kNode, allowed, t, 3),
            (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6}, {0, 1, 2, 3}}));
  EXPECT_EQ(WorkerCpus(CpuAffinity::kSocket, allowed, t, 2)[1], (std::vector<int>{4, 5, 6}));
  EXPECT_TRUE(WorkerCpus(CpuAffinity::kNode, allowed, CpuTopology{}, 2).empty());  // no sysfs: no pinning
  EXPECT_EQ(ParseCpuList("0-2,5,7-8"), (std::vector<int>{0, 1, 2, 5, 7, 8}));
  EXPECT_TRUE(ParseCpuList("3-1").empty());
  std::filesystem::remove_all(root);
}

TEST(Plan, PythonProgramsRunUnderTheInterpreter) {
  LaunchOptions o;
  o.command = {"train.py", "--lr", "1"};
  EXPECT_EQ(WorkerArgv(o, "python3"),
            (std::vector<std::string>{"python3", "-u", "train.py", "--lr", "1"}));
  EXPECT_EQ(WorkerArgv(o, "/opt/venv/bin/python")[0], "/opt/venv/bin/python");  // $PYTHON_EXEC
  EXPECT_TRUE(RunsPython(o));
  o.no_python = true;
  EXPECT_EQ(WorkerArgv(o, "python3"), o.command);
  EXPECT_FALSE(RunsPython(o));
  o.no_python = false;
  o.module = true;
  o.command = {"pkg.mod"};
  EXPECT_EQ(WorkerArgv(o, "python3"), (std::vector<std::string>{"python3", "-u", "-m", "pkg.mod"}));
  o.module = false;
  o.command = {"./train"};
  EXPECT_EQ(WorkerArgv(o, "python3"), o.command);
}

TEST(Plan, TheDefaultInterpreterIsPython3FromPathMadeAbsoluteSoPySpyIsFoundBesideIt) {
  const std::string root = dlrun::testing::MakeTempDir("python");
  const std::string bin = root + "/venv/bin";
  std::filesystem::create_directories(bin);
  std::ofstream(bin + "/python3") << "#!/bin/sh\n";
  std::filesystem::permissions(bin + "/python3", std::filesystem::perms::owner_all);
  std::map<std::string, std::string> vars = {
      {"PATH", "relative/bin:" + root + "/none:" + bin + ":/usr/bin"}};
  auto env = [&vars](std::string_view k) -> std::optional<std::string> {
    auto it = vars.find(std::string(k));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  EXPECT_EQ(DefaultPython(env), bin + "/python3");
  vars["PYTHON_EXEC"] = "/opt/py/bin/python";
  EXPECT_EQ(DefaultPython(env), "/opt/py/bin/python");
  vars.erase("PYTHON_EXEC");
  vars["PATH"] = "relative/bin";
  EXPECT_EQ(DefaultPython(env), "python3");  // nothing absolute to find: as given
  std::filesystem::remove_all(root);
}

TEST(Plan, WarmSparesOnlyForPythonScriptsAndModules) {
  auto spare = WarmSpareArgv({TEST_PYTHON, "-u", "train.py", "--lr", "1"});
  ASSERT_EQ(spare.size(), 7u);
  EXPECT_EQ(spare[0], TEST_PYTHON);
  EXPECT_EQ(spare[1], "-u");
  EXPECT_EQ(spare[2], "-c");
  EXPECT_NE(spare[3].find("DLRUN_SPARE_FD"), std::string::npos);
  EXPECT_NE(spare[3].find("import torch"), std::string::npos);
  EXPECT_EQ(std::vector<std::string>(spare.begin() + 4, spare.end()),
            (std::vector<std::string>{"train.py", "--lr", "1"}));
  spare = WarmSpareArgv({"python3.11", "-u", "-O", "-m", "pkg.train", "x"});
  ASSERT_EQ(spare.size(), 8u);  // the flags stay before -c
  EXPECT_EQ(spare[2], "-O");
  EXPECT_EQ(spare[3], "-c");
  EXPECT_EQ(std::vector<std::string>(spare.begin() + 5, spare.end()),
            (std::vector<std::string>{"-m", "pkg.train", "x"}));
  EXPECT_EQ(WarmSpareArgv({"python", "t.py"}).size(), 4u);
  // No spare: not an interpreter, a flag with a value or an unknown one, -c, nothing to run.
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {"./train_unet", "--max-steps", "3"},
           {"pythonic", "t.py"},
           {"/usr/bin/python3-config", "t.py"},
           {"python3", "-c", "print(1)"},
           {"python3", "-X", "dev", "t.py"},
           {"python3", "-W", "ignore", "t.py"},
           {"python3", "-uB", "t.py"},
           {"python3", "-u"},
           {"python3", "-m"},
           {"python3", "-m", "-x"},
           {"python3"}}) {
    EXPECT_TRUE(WarmSpareArgv(argv).empty()) << argv[0] << " " << (argv.size() > 1 ? argv[1] : "");
  }
}

TEST(Plan, TheSparesBootstrapGoesIntoTheRunDirectoryAndItsCommandNamesTheFile) {
  const std::string dir = dlrun::testing::MakeTempDir("spare");
  const std::vector<std::string> inline_argv = WarmSpareArgv({"python3", "-u", "train.py"});
  const std::vector<std::string> short_argv = SpareArgvFromFile(inline_argv, dir);
  ASSERT_EQ(short_argv.size(), inline_argv.size());
  EXPECT_EQ(short_argv[2], "-c");
  EXPECT_EQ(short_argv[3], "exec(open('" + dir + "/spare_bootstrap.py').read())");
  EXPECT_EQ(short_argv[4], "train.py");
  std::ifstream in(dir + "/spare_bootstrap.py");
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written, inline_argv[3]);  // the same code, DLRUN_SPARE_FD filled in
  // Nowhere to write it, or a path Python's quotes would not hold: the command as given.
  EXPECT_EQ(SpareArgvFromFile(inline_argv, dir + "/missing"), inline_argv);
  std::filesystem::create_directories(dir + "/it's");
  EXPECT_EQ(SpareArgvFromFile(inline_argv, dir + "/it's"), inline_argv);
  EXPECT_EQ(SpareArgvFromFile({"./train_unet"}, dir), std::vector<std::string>{"./train_unet"});
  std::filesystem::remove_all(dir);
}

// Under Slurm, SIGUSR1 (its preemption warning, --signal=USR1@90) is handled by default: passed
// on to the workers with the job running. Its default action ended dlrun with rc 138.
TEST(Plan, SlurmsPreemptionSignalIsPassedOnByDefaultUnderSlurm) {
  LaunchOptions o;
  o.signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};  // the parser's default
  const EnvLookup slurm = [](std::string_view k) -> std::optional<std::string> {
    if (k == "SLURM_JOB_ID") return "42";
    return std::nullopt;
  };
  const EnvLookup none = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  EXPECT_EQ(HandledSignals(o, none), (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(HandledSignalsText(o, none), "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_EQ(HandledSignals(o, slurm), (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1}));
  EXPECT_EQ(HandledSignalsText(o, slurm), "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1");
  AgentOptions a;
  SplitSignals(HandledSignals(o, slurm), &a);
  EXPECT_EQ(a.passthrough_signals, (std::vector<int>{SIGUSR1}));
  // A list given on the command line is the user's, under Slurm too.
  o.signals_to_handle = {SIGTERM};
  o.signals_to_handle_text = "SIGTERM";
  o.signals_to_handle_given = true;
  EXPECT_EQ(HandledSignals(o, slurm), (std::vector<int>{SIGTERM}));
  EXPECT_EQ(HandledSignalsText(o, slurm), "SIGTERM");
}

TEST(Plan, ThreadsSignalsRunDirAndStaticAssignment) {
  EXPECT_EQ(OmpThreads(false, 8, 3), 2);
  EXPECT_EQ(OmpThreads(false, 2, 4), 1);
  EXPECT_EQ(OmpThreads(true, 8, 2), 0);   // the user's value is kept
  EXPECT_EQ(OmpThreads(false, 8, 1), 0);  // one worker: left alone, as torchrun
  AgentOptions a;
  SplitSignals({SIGTERM, SIGUSR1, SIGINT, SIGUSR2}, &a);
  EXPECT_EQ(a.forwarded_signals, (std::vector<int>{SIGTERM, SIGINT}));
  EXPECT_EQ(a.passthrough_signals, (std::vector<int>{SIGUSR1, SIGUSR2}));
  EXPECT_EQ(ScratchRunDir("/scratch", 1000, "job", 42), "/scratch/dlrun-1000/job-42");
  EXPECT_EQ(ScratchRunDir("", 0, "j", 1), "/tmp/dlrun-0/j-1");
  LaunchOptions o;
  o.max_nodes = 3;
  o.node_rank = 2;
  o.max_restarts = 4;
  const Assignment s = StaticAssignment(o, 4);
  EXPECT_EQ(s.rank_offset, 8);
  EXPECT_EQ(s.world_size, 12);
  EXPECT_EQ(s.num_nodes, 3);
  EXPECT_EQ(s.max_restarts, 4);
  EXPECT_EQ(s.master_addr, "127.0.0.1");
  o.rdzv_endpoint = "node7:1234";  // torchrun's static backend takes the store from here
  EXPECT_EQ(StaticAssignment(o, 4).master_addr, "node7");
  EXPECT_EQ(StaticAssignment(o, 4).master_port, 1234);
  o.rdzv_endpoint = "[::1]:99";
  EXPECT_EQ(StaticAssignment(o, 4).master_addr, "::1");
  EXPECT_EQ(RunLogDirTemplate("/logs", "job", "n1", false), "/logs/job_XXXXXX");
  EXPECT_EQ(RunLogDirTemplate("/logs", "job", "n1", true), "/logs/job_n1_XXXXXX");
}

}  // namespace
}  // namespace dlrun::launcher
