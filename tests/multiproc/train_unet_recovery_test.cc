// train_unet through failures: an HDF5 dataset, a worker killed and replaced by its spare held
// in init(), the report's counts, a forced restart resumed at the right step and LR, and a
// resume that ends bit-identical to the run without the fault.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...


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
       "--spare-workers", "on", "--recovery", "restart", TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4",
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
      {DLRUN_BIN, "--nproc-per-node", "2", "--max-restarts", "1", "--recovery", "restart",
       TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4", "--max-steps", "5", "--checkpoint-dir", dir + "/ckpt",
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

// The exact resume (issue 40): a run whose last rank dies at step 5 and resumes from the
// checkpoint at step 4 ends bit-identical to the same run without the fault: the same final
// loss and the same parameter digest on every rank. Synthetic data with two micro-batches a
// step on 2 ranks; an HDF5 file read by 2 loader threads on 4 ranks. Both validate every
// epoch (2 steps), so the validation stream is picked up where it was too.
TEST(TrainUnet, AResumeEndsBitIdenticalToTheUninterruptedRun) {
  const std::string dir = MakeTempDir();
  ProcResult gen = RunCommand({MAKE_UNET_DATA_BIN, dir + "/data.h5", "64", "3"});
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  // Epochs of 8 samples (2 steps at a global batch of 4), 4 validation samples each.
  std::ofstream(dir + "/c.yaml") << "resume_test:\n  Nsamples: 8\n  Nsamples_val: 4\n";
  struct Case {
    std::string ranks;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {"2", {"--synthetic", "--accumulation-steps", "2"}},
      {"4", {"--data", dir + "/data.h5", "--num-data-workers", "2"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.ranks + " ranks, " + c.args[0]);
    nlohmann::json runs[2];
    std::string last_val[2];
    for (int faulty = 0; faulty < 2; ++faulty) {
      const std::string tag = c.ranks + "-" + std::to_string(faulty);
      std::vector<std::string> cmd = {
          DLRUN_BIN, "--nproc-per-node", c.ranks, "--max-restarts", "1", "--recovery", "restart",
          TRAIN_UNET_BIN,
          "--base-channels", "4", "--max-steps", "6", "--yaml-config", dir + "/c.yaml",
          "--config", "resume_test", "--seed", "3", "--checkpoint-dir", dir + "/ckpt-" + tag, "--checkpoint-every", "2",
          "--metrics-json", dir + "/m-" + tag + ".json"};
      cmd.insert(cmd.end(), c.args.begin(), c.args.end());
      if (faulty) cmd.insert(cmd.end(), {"--fail-at-step", "5"});
      ProcResult r = RunCommand(cmd, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(400));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      if (faulty) {
        ASSERT_NE(r.output.find("resumed from step 4"), std::string::npos) << r.output;
      }
      runs[faulty] = nlohmann::json::parse(ReadFile(dir + "/m-" + tag + ".json"));
      const size_t at = r.output.rfind("Avg val loss=");
      ASSERT_NE(at, std::string::npos) << r.output;
      last_val[faulty] = r.output.substr(at, r.output.find('\n', at) - at);
    }
    EXPECT_EQ(runs[1]["start_step"], 4);
    EXPECT_EQ(runs[0]["final_loss"].get<double>(), runs[1]["final_loss"].get<double>());
    EXPECT_EQ(runs[0]["param_digests"], runs[1]["param_digests"]);
    EXPECT_EQ(runs[0]["param_digests"].size(), std::stoul(c.ranks));
    EXPECT_EQ(last_val[0], last_val[1]) << "the last epoch's validation";
  }
}

}  // namespace
}  // namespace dlrun::testing
