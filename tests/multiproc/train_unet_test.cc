// Two ranks under dlrun train the U-Net with real Gloo allreduce; their parameters must agree
// bit for bit, and must not agree when gradient sync is switched off (the negative control).
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"

namespace dlrun::testing {
namespace {

nlohmann::json TrainTwoRanks(const std::vector<std::string>& extra) {
  const std::string metrics = MakeTempDir() + "/metrics.json";
  std::vector<std::string> cmd = {DLRUN_BIN,     "--standalone",    "--nproc-per-node",
                                  "2",           TRAIN_UNET_BIN,    "--synthetic",
                                  "--base-channels", "4",           "--max-steps",
                                  "3",           "--metrics-json",  metrics};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  ProcResult r = RunCommand(cmd, {{"OMP_NUM_THREADS", "1"}});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("samples/sec"), std::string::npos) << r.output;
  return nlohmann::json::parse(ReadFile(metrics));
}

// --profile perf on a C++ trainer (docs/PROFILING.md): the real perf attached to rank 0 only,
// enabled from the end of step 4 to the end of step 10 through its control fifo.
TEST(TrainUnet, PerfProfilesTheStepRangeOfRankZeroAndItsFlameGraphNamesTheConvolutions) {
  const std::string tmp = MakeTempDir();
  const std::string report = tmp + "/report.json";
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--log-dir",
                             tmp + "/logs", "--report-json", report, "--profile", "perf",
                             "--profile-ranks", "0", "--profile-steps", "5:10", TRAIN_UNET_BIN,
                             "--synthetic", "--base-channels", "8", "--data-size", "64",
                             "--max-steps", "16"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
  if (r.exit_code == 2 && (r.output.find("perf events are not allowed") != std::string::npos ||
                           r.output.find("perf is not installed") != std::string::npos)) {
    GTEST_SKIP() << r.output;
  }
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(ReadFile(report));
  ASSERT_EQ(j["profiles"].size(), 1u) << j["profiles"].dump() << r.output;
  const std::string svg_path = j["profiles"]["0"].get<std::string>();
  const std::string svg = ReadFile(svg_path);
  // The 3-D convolutions' ATen frames (at::native::_convolution under conv3d, and
  // convolution_backward): DWARF call chains reach them from the oneDNN kernels; conv3d's own
  // frame is further out, in the few forward samples whose 32 KB of stack reach it.
  EXPECT_NE(svg.find("at::native::convolution_backward"), std::string::npos);
  EXPECT_NE(svg.find("convolution"), std::string::npos);
  // Only steps 5-10: about 99 samples a second of rank 0's one busy thread over six steps, far
  // fewer than over the whole run (start-up and 16 steps).
  int64_t samples = 0;
  std::string folded = ReadFile(svg_path.substr(0, svg_path.size() - 4) + ".folded");
  for (absl::string_view line : absl::StrSplit(folded, '\n', absl::SkipEmpty())) {
    int64_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &n)) << line;
    samples += n;
  }
  const double p95 = j["ranks"]["0"]["step_time_p95_s"].get<double>();
  EXPECT_GE(samples, 10) << folded;
  EXPECT_LE(samples, 99 * (6 * p95 * 1.5 + 0.2)) << "p95 step " << p95 << " s";
  EXPECT_NE(r.output.find("rank 0: "), std::string::npos) << "the report names the hot frames";
  std::filesystem::remove_all(tmp);
}

#ifdef NVTX_RECORD_LIB
// One event of tests/worker/nvtx_record.cc's log: its kind, thread or range id, and name.
struct NvtxEvent {
  std::string kind;  // push, pop, start, end, cudaProfilerStart, cudaProfilerStop
  std::string who;   // the thread (push, pop) or the range id (start, end)
  std::string name;  // with its payload, e.g. "step 2"
};

std::vector<NvtxEvent> ReadNvtxLog(const std::string& path) {
  std::vector<NvtxEvent> events;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    std::vector<std::string> w = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    events.push_back({w[0], w.size() > 1 ? w[1] : "", w.size() > 2 ? w[2] : ""});
  }
  return events;
}

size_t IndexOf(const std::vector<NvtxEvent>& ev, const std::string& kind, const std::string& name,
               size_t from = 0) {
  for (size_t i = from; i < ev.size(); ++i) {
    if (ev[i].kind == kind && ev[i].name == name) return i;
  }
  return ev.size();
}

// The pop that closes the push at `open` (same thread, same depth).
size_t MatchingPop(const std::vector<NvtxEvent>& ev, size_t open) {
  int depth = 0;
  for (size_t i = open; i < ev.size(); ++i) {
    if (ev[i].who != ev[open].who) continue;
    if (ev[i].kind == "push") ++depth;
    if (ev[i].kind == "pop" && --depth == 0) return i;
  }
  return ev.size();
}

// NVTX ranges (dlrun/ranges.h) through a real NVTX tool interface: our injection library
// records the "dlrun" domain. Rank 1 also runs under --profile nsys (the stub) with steps 2:3, and
// the same library stands in for cudaProfilerStart/Stop.
TEST(TrainUnet, OneStepEmitsItsNvtxRangesInOrderAndNsysCapturesOnlyTheStepRange) {
  const std::string tmp = MakeTempDir();
  std::filesystem::create_directories(tmp + "/nvtx");
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--log-dir", tmp + "/logs", "--profile",
       "nsys", "--profile-ranks", "1", "--profile-steps", "2:3", TRAIN_UNET_BIN, "--synthetic",
       "--base-channels", "4", "--data-size", "64", "--max-steps", "5", "--checkpoint-dir",
       tmp + "/ckpt", "--checkpoint-every", "4"},
      {{"OMP_NUM_THREADS", "1"}, {"NVTX_INJECTION64_PATH", NVTX_RECORD_LIB},
       {"LD_PRELOAD", NVTX_RECORD_LIB}, {"NVTX_RECORD_DIR", tmp + "/nvtx"},
       {"DLRUN_NSYS", std::string(SOURCE_DIR) + "/tests/multiproc/nsys_stub.sh"},
       {"NSYS_STUB_LOG", tmp + "/nsys.log"}},
      std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string nsys = ReadFile(tmp + "/nsys.log");
  EXPECT_EQ(std::count(nsys.begin(), nsys.end(), '\n'), 1) << nsys;
  EXPECT_EQ(nsys.rfind("RANK=1 DLRUN_PROFILE_STEPS=2:3 profile -o ", 0), 0u) << nsys;
  EXPECT_NE(nsys.find("--capture-range=cudaProfilerApi --capture-range-end=stop -- "),
            std::string::npos) << nsys;

  int logs = 0, captured = 0, saves = 0;
  for (const auto& f : std::filesystem::directory_iterator(tmp + "/nvtx")) {
    const std::vector<NvtxEvent> ev = ReadNvtxLog(f.path());
    const size_t step = IndexOf(ev, "push", "step 2");
    if (step == ev.size()) continue;  // a process with no training steps
    ++logs;
    SCOPED_TRACE(f.path().string());
    const size_t step_end = MatchingPop(ev, step);
    ASSERT_LT(step_end, ev.size());
    // The step's own ranges on its thread, in order, each closed before the next opens.
    std::vector<std::string> inside;
    size_t backward = 0, backward_end = 0, optimizer = 0;
    for (size_t i = step + 1; i < step_end; ++i) {
      if (ev[i].kind != "push" || ev[i].who != ev[step].who) continue;
      const size_t end = MatchingPop(ev, i);
      if (ev[i].name == "backward") backward = i, backward_end = end;
      if (ev[i].name == "optimizer step") optimizer = i;
      if (ev[i].name != "broadcast buffers") inside.push_back(ev[i].name);
      i = end;
    }
    EXPECT_EQ(inside, (std::vector<std::string>{"data wait", "forward", "backward", "optimizer step"}));
    // Each bucket's all-reduce: started during backward, in bucket order, reduced before the
    // optimizer step.
    std::vector<std::string> buckets;
    for (size_t i = step; i < step_end; ++i) {
      if (ev[i].kind != "start") continue;
      buckets.push_back(ev[i].name);
      EXPECT_GT(i, backward);
      EXPECT_LT(i, backward_end);
      size_t end = i + 1;
      while (end < ev.size() && !(ev[end].kind == "end" && ev[end].who == ev[i].who)) ++end;
      EXPECT_LT(end, optimizer) << ev[i].name << " is still open at the optimizer step";
    }
    ASSERT_FALSE(buckets.empty());
    for (size_t b = 0; b < buckets.size(); ++b) {
      EXPECT_EQ(buckets[b], "allreduce bucket " + std::to_string(b));
    }
    // The checkpoint of step 4 (rank 0 writes it), after that step.
    const size_t save = IndexOf(ev, "push", "checkpoint save 4");
    if (save < ev.size()) {
      ++saves;
      EXPECT_GT(save, MatchingPop(ev, IndexOf(ev, "push", "step 4")));
    }
    // nsys's capture (rank 1 only): from the end of step 1 to the end of step 3.
    const size_t start = IndexOf(ev, "cudaProfilerStart", "");
    if (start == ev.size()) {
      EXPECT_EQ(IndexOf(ev, "cudaProfilerStop", ""), ev.size());
      continue;
    }
    ++captured;
    EXPECT_GT(start, MatchingPop(ev, IndexOf(ev, "push", "step 1")));
    EXPECT_LT(start, step);
    const size_t stop = IndexOf(ev, "cudaProfilerStop", "");
    EXPECT_GT(stop, MatchingPop(ev, IndexOf(ev, "push", "step 3")));
    EXPECT_LT(stop, IndexOf(ev, "push", "step 4"));
  }
  EXPECT_EQ(logs, 2) << "both ranks' ranges";
  EXPECT_EQ(captured, 1) << "only rank 1 captures";
  EXPECT_EQ(saves, 1) << "rank 0's checkpoint";
  std::filesystem::remove_all(tmp);
}
#endif

TEST(TrainUnet, ParametersIdenticalOnBothRanksAfterTraining) {
  nlohmann::json m = TrainTwoRanks({});
  EXPECT_EQ(m["world_size"], 2);
  ASSERT_EQ(m["param_digests"].size(), 2u);
  EXPECT_EQ(m["param_digests"][0], m["param_digests"][1]);
  EXPECT_NE(m["param_digests"][0], m["initial_param_digest"]);  // training changed them
  EXPECT_GT(m["samples_per_sec"].get<double>(), 0.0);
}

// Gradient accumulation (--accumulation-steps): two micro-batches of 1 on each of two ranks,
// the first without gradient sync, give the step that one batch of 2 gives, within 1e-6; the
// effective global batch is counted in LR scaling and samples/s.
TEST(TrainUnet, TwoMicroBatchesOfOneEqualOneBatchOfTwo) {
  // Linear LR scaling from a base batch of 2: the effective batch decides the LR.
  const std::vector<std::string> lr = {"--lr-scaling", "linear", "--base-batch-size", "2"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), lr.begin(), lr.end());
    return v;
  };
  nlohmann::json once = TrainTwoRanks(with({"--local-batch-size", "2"}));
  nlohmann::json twice = TrainTwoRanks(with({"--local-batch-size", "1", "--accumulation-steps", "2"}));
  nlohmann::json plain = TrainTwoRanks(with({"--local-batch-size", "1"}));
  EXPECT_EQ(twice["accumulation_steps"], 2);
  EXPECT_EQ(twice["global_batch_size"], 4);
  EXPECT_EQ(once["global_batch_size"], 4);
  EXPECT_EQ(twice["param_digests"][0], twice["param_digests"][1]);  // synced on the last one
  const double g1 = once["grad_norm"].get<double>(), g2 = twice["grad_norm"].get<double>();
  EXPECT_GT(g1, 0);
  EXPECT_NEAR(g1, g2, 1e-6 * g1);
  EXPECT_NEAR(once["final_loss"].get<double>(), twice["final_loss"].get<double>(), 1e-6);
  EXPECT_NEAR(once["final_lr"].get<double>(), twice["final_lr"].get<double>(), 1e-12);
  EXPECT_NEAR(plain["final_lr"].get<double>(), once["final_lr"].get<double>() / 2, 1e-12);
  // The control: one micro-batch of 1 is another step.
  EXPECT_GT(std::abs(plain["grad_norm"].get<double>() - g1), 1e-4 * g1);
}

// --checkpoint-activations: the same gradients and loss within 1e-6, less peak memory: the
// most tensor memory allocated at once over the step (LibTorch's CPU allocation reports; RSS
// is blurred by what the allocator keeps). 128^3 crops, where activations dominate.
TEST(TrainUnet, ActivationCheckpointingKeepsTheGradientsAndLowersPeakMemory) {
  const std::string dir = MakeTempDir();
  nlohmann::json m[2];
  for (int i = 0; i < 2; ++i) {
    const std::string path = dir + "/m" + std::to_string(i) + ".json";
    std::vector<std::string> cmd = {TRAIN_UNET_BIN, "--synthetic", "--base-channels", "8",
                                    "--data-size", "128", "--local-batch-size", "2",
                                    "--max-steps", "1", "--measure-allocations",
                                    "--metrics-json", path};
    if (i == 1) cmd.push_back("--checkpoint-activations");
    ProcResult r = RunCommand(cmd, {{"OMP_NUM_THREADS", "2"}}, std::chrono::seconds(240));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    m[i] = nlohmann::json::parse(ReadFile(path));
  }
  EXPECT_EQ(m[1]["checkpoint_activations"], true);
  const double g = m[0]["grad_norm"].get<double>();
  EXPECT_NEAR(m[1]["grad_norm"].get<double>(), g, 1e-6 * g);
  EXPECT_NEAR(m[1]["first_loss"].get<double>(), m[0]["first_loss"].get<double>(), 1e-6);
  const int64_t plain = m[0]["peak_allocated_bytes"].get<int64_t>();
  const int64_t ckpt = m[1]["peak_allocated_bytes"].get<int64_t>();
  EXPECT_GT(plain, int64_t{100} << 20);  // measured: activations and workspaces of the step
  EXPECT_LT(ckpt, plain - (int64_t{10} << 20)) << "the concatenations are not kept";
}

TEST(TrainUnet, WithoutGradientSyncRanksDiverge) {
  nlohmann::json m = TrainTwoRanks({"--no-grad-sync"});
  ASSERT_EQ(m["param_digests"].size(), 2u);
  EXPECT_NE(m["param_digests"][0], m["param_digests"][1]);
}

TEST(TrainUnet, InconsistentEnvironmentIsAClearError) {
  ProcResult r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--max-steps", "1"},
                            {{"RANK", "3"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                             {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "train_unet: RANK=3 is not below WORLD_SIZE=2\n");
  // Rank 1 of 2 whose rank 0 never comes: the error names the address and port, after the
  // (shortened) init timeout, and the torchelastic error file records it for dlrun.
  const std::string err_file = MakeTempDir() + "/error.json";
  const int port = FreeTcpPort();
  r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--max-steps", "1"},
                 {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                  {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                  {"DLRUN_INIT_TIMEOUT", "1"}, {"TORCHELASTIC_ERROR_FILE", err_file}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("cannot reach the c10d store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << r.output;
  EXPECT_NE(ReadFile(err_file).find("cannot reach the c10d store"), std::string::npos);
  r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--data-size", "48"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("multiple of 64"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dlrun::testing

namespace dlrun::testing {
namespace {

TEST(TrainUnet, TrainsOnAGeneratedHdf5FileAndTheLossFalls) {
  const std::string dir = MakeTempDir();
  ProcResult gen = RunCommand({MAKE_UNET_DATA_BIN, dir + "/data.h5", "64", "3"});
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "2", TRAIN_UNET_BIN, "--data",
                             dir + "/data.h5", "--base-channels", "8", "--max-steps", "8",
                             "--lr", "2e-3", "--num-data-workers", "1", "--metrics-json",
                             dir + "/m.json"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
  EXPECT_LT(m["final_loss"].get<double>(), m["first_loss"].get<double>()) << m.dump();
  EXPECT_EQ(m["param_digests"][0], m["param_digests"][1]);
  EXPECT_NE(r.output.find("rotations on the device"), std::string::npos) << r.output;
  // The thread budget: one rank on two CPUs (the affinity mask) with the default two loader
  // threads gets one loader and one intra-op thread; loader threads asked for are kept.
  for (const char* workers : {"", "2"}) {
    std::vector<std::string> cmd = {"taskset", "-c", "0,1", TRAIN_UNET_BIN, "--data",
                                    dir + "/data.h5", "--base-channels", "4", "--max-steps", "1",
                                    "--metrics-json", dir + "/t.json"};
    if (*workers) cmd.insert(cmd.end(), {"--num-data-workers", workers});
    ProcResult t = RunCommand(cmd, {}, std::chrono::seconds(120));
    ASSERT_EQ(t.exit_code, 0) << t.output;
    auto j = nlohmann::json::parse(ReadFile(dir + "/t.json"));
    EXPECT_EQ(j["loader_threads"], *workers ? 2 : 1) << t.output;
    EXPECT_EQ(j["intra_op_threads"], 1) << t.output;
    EXPECT_NE(t.output.find(*workers ? "2 loader + 1 intra-op (2 CPU(s) per rank)"
                                     : "1 loader + 1 intra-op (2 CPU(s) per rank)"),
              std::string::npos)
        << t.output;
  }
}

// The worker pids of the `n`-th rank table (0-based) the agent printed.
std::vector<int> TablePids(const std::string& out, int n) {
  size_t at = 0;
  for (int i = 0; i <= n; ++i) {
    at = out.find("local_rank  rank  pid\n", at);
    if (at == std::string::npos) return {};
    at += 22;
  }
  std::vector<int> pids;
  std::istringstream in(out.substr(at));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    int lr = 0, rank = 0, pid = 0;
    std::string rest;
    if (!(f >> lr >> rank >> pid) || (f >> rest)) break;
    pids.push_back(pid);
  }
  return pids;
}

std::set<int> Children(int pid) {
  std::set<int> out;
  std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/task/" +
                                 std::to_string(pid) + "/children"));
  for (int c = 0; in >> c;) out.insert(c);
  return out;
}

// `--spare-workers on`: a C++ worker built on dlrun::worker is started ahead as a spare and held
// in init(); after a worker is killed, the restarted ranks are those spares, and they resume
// from the checkpoint and finish.
TEST(TrainUnet, ACppWorkerKilledIsReplacedByItsSpareHeldInInit) {
  const std::string dir = MakeTempDir();
  Started s = StartCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
       "--spare-workers", "on", TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4",
       "--data-size", "64", "--max-steps", "60", "--checkpoint-dir", dir + "/ckpt",
       "--checkpoint-every", "5", "--metrics-json", dir + "/m.json"},
      {{"OMP_NUM_THREADS", "1"}});
  ASSERT_TRUE(ReadUntil(s, "step 5/60", 1, std::chrono::seconds(120))) << s.output;
  const std::vector<int> workers = TablePids(s.output, 0);
  ASSERT_EQ(workers.size(), 2u) << s.output;
  // The spares: the agent's other two children (started 2 s after the workers).
  std::set<int> spares;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (spares.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    spares = Children(s.pid);
    for (int w : workers) spares.erase(w);
    if (spares.size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(spares.size(), 2u) << s.output;
  ASSERT_EQ(kill(workers[1], SIGKILL), 0);
  ASSERT_TRUE(ReadUntil(s, "resumed from step", 1, std::chrono::seconds(120))) << s.output;
  const std::vector<int> restarted = TablePids(s.output, 1);
  EXPECT_EQ(std::set<int>(restarted.begin(), restarted.end()), spares) << s.output;
  ASSERT_EQ(FinishCommand(s, std::chrono::seconds(240)), 0) << s.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
  EXPECT_EQ(m["steps"], 60);
  EXPECT_GE(m["start_step"].get<int>(), 5);
}

// train_unet's step records: the report agrees with the trainer's own counts.
TEST(TrainUnet, TheReportAgreesWithTheTrainersOwnCounts) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--report-json", dir + "/report.json",
       TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4", "--max-steps", "5",
       "--metrics-json", dir + "/m.json"},
      {{"OMP_NUM_THREADS", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
  auto j = nlohmann::json::parse(ReadFile(dir + "/report.json"));
  ASSERT_EQ(j["ranks"].size(), 2u) << j.dump();
  for (const char* rank : {"0", "1"}) {
    const auto& x = j["ranks"][rank];
    EXPECT_EQ(x["steps"], m["steps"]);
    EXPECT_EQ(x["samples"].get<int64_t>(), m["steps"].get<int64_t>() * m["local_batch_size"].get<int64_t>())
        << m.dump();
    EXPECT_GT(x["step_time_p50_s"].get<double>(), 0);
    EXPECT_LE(x["step_time_p50_s"].get<double>(), x["step_time_p95_s"].get<double>());
    EXPECT_GE(x["data_wait_fraction"].get<double>(), 0);
    EXPECT_LT(x["data_wait_fraction"].get<double>(), 1);
  }
  EXPECT_NEAR(j["ranks"]["0"]["loss"].get<double>(), m["final_loss"].get<double>(), 1e-5);
}

TEST(TrainUnet, ResumesAfterAForcedRestartAtTheRightStepAndLr) {
  const std::string dir = MakeTempDir();
  // Checkpoints every 2 steps; the last rank dies at step 3 of the first attempt; dlrun
  // restarts both; they resume from step 2 and finish at step 5 with the schedule's LR.
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--nproc-per-node", "2", "--max-restarts", "1", TRAIN_UNET_BIN, "--synthetic",
       "--base-channels", "4", "--max-steps", "5", "--checkpoint-dir", dir + "/ckpt",
       "--checkpoint-every", "2", "--fail-at-step", "3", "--lr", "1e-3", "--end-lr", "1e-4",
       "--metrics-json", dir + "/m.json"},
      {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
  EXPECT_EQ(m["start_step"], 2);
  // Cosine from 1e-3 to 1e-4 over 5 steps, at step index 4 (the 5th step).
  const double expected = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + std::cos(M_PI * 4 / 5));
  EXPECT_NEAR(m["final_lr"].get<double>(), expected, 1e-12);
  EXPECT_EQ(m["param_digests"][0], m["param_digests"][1]);
}

}  // namespace
}  // namespace dlrun::testing

namespace dlrun::testing {
namespace {

TEST(TrainUnet, ChannelsLastOnTheCpuTrainsAndDeviceFlagsAreChecked) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "2", TRAIN_UNET_BIN, "--synthetic",
                             "--base-channels", "4", "--max-steps", "3", "--channels-last",
                             "--device", "cpu", "--metrics-json", dir + "/m.json"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device cpu, channels-last"), std::string::npos) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
  EXPECT_EQ(m["param_digests"][0], m["param_digests"][1]);
  EXPECT_LT(m["final_loss"].get<double>(), m["first_loss"].get<double>());
  r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--device", "tpu"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--device"), std::string::npos) << r.output;
}

TEST(TrainUnet, TutorialStyleConfigRunsEpochsWithValidation) {
  const std::string yaml = std::string(SOURCE_DIR) + "/examples/unet/config/UNet.yaml";
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "2", TRAIN_UNET_BIN, "--yaml-config",
                             yaml, "--config", "cpu_tiny", "--base-channels", "4"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // cpu_tiny: 2 epochs of 8 samples over a global batch of 2 -> 4 steps each, validation each.
  EXPECT_NE(r.output.find("Time taken for epoch 1 is"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Time taken for epoch 2 is"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Time taken for epoch 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 8/8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Avg val loss="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("base width 4"), std::string::npos);  // the flag overrides the config
  // --num-epochs over the configuration's; --target-loss: reached at the first epoch's end for
  // a loss any model reaches, never for one none does.
  const std::string dir = MakeTempDir();
  for (const char* target : {"10", "1e-9"}) {
    r = RunCommand({TRAIN_UNET_BIN, "--yaml-config", yaml, "--config", "cpu_tiny",
                    "--base-channels", "4", "--num-epochs", "3", "--no-tf32", "--target-loss",
                    target, "--metrics-json", dir + "/m.json"},
                   {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Time taken for epoch 3 is"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 12/12"), std::string::npos) << r.output;
    auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
    if (std::string(target) == "10") {
      EXPECT_EQ(m["target_loss_step"], 4) << m.dump();  // 8 samples / batch 2 per epoch
      EXPECT_EQ(m["target_loss_of"], "validation");
      EXPECT_GT(m["target_loss_s"].get<double>(), 0);
      EXPECT_NE(r.output.find("target loss 10 reached at step 4"), std::string::npos) << r.output;
    } else {
      EXPECT_TRUE(m["target_loss_step"].is_null()) << m.dump();
    }
  }
  r = RunCommand({TRAIN_UNET_BIN, "--yaml-config", yaml, "--config", "nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("no configuration 'nope'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dlrun::testing

namespace dlrun::testing {
namespace {

TEST(TrainUnet, BenchyTrialsAndTheDensityLossTerm) {
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "2", TRAIN_UNET_BIN, "--synthetic",
                             "--base-channels", "4", "--max-steps", "2", "--benchy",
                             "--benchy-trials", "3"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Three trials per mode, then each mode's mean +/- spread.
  for (const char* mode : {"IO", "SYNTHETIC", "FULL"}) {
    EXPECT_NE(r.output.find(std::string("BENCHY::") + mode + " trial 3: "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(std::string("BENCHY::") + mode + " trial 4: "), std::string::npos);
  }
  EXPECT_NE(r.output.find(" +/- "), std::string::npos) << r.output;
  for (const char* line : {"BENCHY::SUMMARY::IO average trial throughput: ",
                           "BENCHY::SUMMARY:: SYNTHETIC average trial throughput: ",
                           "BENCHY::SUMMARY::FULL average trial throughput: ", "FULL is bounded by"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  // lambda_rho adds a non-negative term: the same first step has a larger loss with it.
  const std::string dir = MakeTempDir();
  double first[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const std::string m = dir + "/m" + std::to_string(i) + ".json";
    ProcResult t = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4",
                               "--max-steps", "1", "--lambda-rho", i ? "0.5" : "0",
                               "--metrics-json", m},
                              {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(120));
    ASSERT_EQ(t.exit_code, 0) << t.output;
    first[i] = nlohmann::json::parse(ReadFile(m))["first_loss"].get<double>();
  }
  EXPECT_GT(first[1], first[0]);
}

// `dlrun stacks` on a C++ trainer: native frames with symbols through eu-stack, and a rank
// stopped with SIGSTOP is read (eu-stack attaches to a stopped process) or named missing, within
// the bound (docs/STACKS.md).
TEST(TrainUnet, DlrunStacksReadsNativeFramesAndAStoppedRank) {
  const std::string tmp = MakeTempDir();
  Started job = StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", TRAIN_UNET_BIN,
                              "--synthetic", "--base-channels", "4", "--max-steps", "1000000"},
                             {{"TMPDIR", tmp}, {"OMP_NUM_THREADS", "1"}});
  ASSERT_TRUE(ReadUntil(job, "step 3/", 1, std::chrono::seconds(120))) << job.output;
  auto stacks = [&tmp] {
    ProcResult r = RunCommand({DLRUN_BIN, "stacks", "--json", "--timeout", "5"}, {{"TMPDIR", tmp}},
                              std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  };
  // A main thread caught inside oneDNN's JIT-generated kernels cannot be unwound past them (no
  // unwind tables there: one "??" frame), so the dump is taken again, a few times at most,
  // until a rank's main thread shows a frame of the trainer.
  nlohmann::json j;
  bool trainer_frame = false;
  for (int attempt = 0; attempt < 10 && !trainer_frame; ++attempt) {
    j = stacks();
    ASSERT_TRUE(j.is_object());
    for (const auto& g : j["groups"]) {
      for (const auto& f : g["frames"]) {
        // The trainer's own source line (with its debug information), or its function.
        const std::string frame = f.get<std::string>();
        trainer_frame |= frame.find("examples/unet/trainer.cc:") != std::string::npos ||
                         frame.find("TrainUnetMain") != std::string::npos;
      }
    }
  }
  EXPECT_TRUE(trainer_frame) << j.dump(1);
  int pid1 = -1;
  for (const auto& r : j["ranks"]) {
    EXPECT_EQ(r["tool"], "eu-stack") << r.dump();
    if (r["rank"] == 1) pid1 = r["pid"].get<int>();
    EXPECT_LT(r["pause_ms"].get<double>(), 5000.0);
  }
  ASSERT_GT(pid1, 0);
  ASSERT_EQ(kill(pid1, SIGSTOP), 0);
  const nlohmann::json stopped = stacks();
  kill(pid1, SIGCONT);
  ASSERT_TRUE(stopped.is_object());
  bool accounted = false;
  for (const auto& g : stopped["groups"]) {
    for (const auto& r : g["ranks"]) accounted |= r == 1;
  }
  for (const auto& m : stopped["missing"]) {
    if (m["rank"] == 1) accounted = !m["why"].get<std::string>().empty();
  }
  EXPECT_TRUE(accounted) << stopped.dump(1);
  EXPECT_LT(stopped["took_s"].get<double>(), 6.0);
  kill(job.pid, SIGTERM);
  FinishCommand(job, std::chrono::seconds(60));
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace dlrun::testing
