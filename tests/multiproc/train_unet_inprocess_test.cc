// In-process recovery (issue 39, docs/RECOVERY.md "A fault costs one step"): train_unet on
// 4 ranks, one SIGKILLed at a step: the survivors keep running, the lost rank takes the state
// from a survivor, no checkpoint is read, at most one step is done again, and the run ends
// bit-identical to the run without the fault. Then the fallbacks: a replacement that never
// joins, and one whose parameters differ, each end in the ordinary restart from the checkpoint
// with a one-line reason.
#include <signal.h>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

std::vector<std::string> TrainUnet(const std::string& dir, const std::string& tag,
                                   const std::vector<std::string>& dlrun_flags,
                                   const std::vector<std::string>& more, int steps = 7) {
  std::vector<std::string> cmd = {DLRUN_BIN, "--nproc-per-node", "4", "--report-json",
                                  dir + "/report-" + tag + ".json"};
  cmd.insert(cmd.end(), dlrun_flags.begin(), dlrun_flags.end());
  cmd.insert(cmd.end(), {TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4", "--max-steps",
                         std::to_string(steps), "--checkpoint-every", "2", "--seed", "5",
                         "--checkpoint-dir", dir + "/ckpt-" + tag, "--metrics-json",
                         dir + "/m-" + tag + ".json"});
  cmd.insert(cmd.end(), more.begin(), more.end());
  return cmd;
}

// The pids of the rank tables the agent printed, table by table.
std::vector<std::set<int>> RankTables(const std::string& out) {
  std::vector<std::set<int>> tables;
  for (size_t at = out.find("local_rank  rank  pid\n"); at != std::string::npos;
       at = out.find("local_rank  rank  pid\n", at + 1)) {
    std::istringstream in(out.substr(at + 22));
    std::set<int> pids;
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      int lr = 0, rank = 0, pid = 0;
      if (!(f >> lr >> rank >> pid)) break;
      pids.insert(pid);
    }
    tables.push_back(pids);
  }
  return tables;
}

TEST(InProcessRecovery, AKilledRankCostsOneStepAndTheRunEndsBitIdentical) {
  const std::string dir = MakeTempDir();
  ProcResult clean = RunCommand(TrainUnet(dir, "clean", {}, {}), {{"OMP_NUM_THREADS", "1"}},
                                std::chrono::seconds(240));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  // The last rank SIGKILLs itself at the start of step 4 (after the checkpoint of step 2).
  ProcResult r = RunCommand(TrainUnet(dir, "fault", {}, {"--fail-at-step", "4", "--fail-how", "kill"}),
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("--fail-at-step 4: SIGKILL as asked"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(
      R"(rank 3 \(local rank 3, pid (\d+)\): SIGKILL; in-process recovery: the 3 other rank\(s\) keep running, local rank 3 as pid (\d+) \(generation 1)")))
      << r.output;
  const int lost = std::stoi(m[1]), replacement = std::stoi(m[2]);
  // One group the whole run: one rank table, no restart, no checkpoint read.
  const std::vector<std::set<int>> tables = RankTables(r.output);
  ASSERT_EQ(tables.size(), 1u) << r.output;
  EXPECT_EQ(tables[0].count(lost), 1u);
  EXPECT_EQ(tables[0].count(replacement), 0u);
  EXPECT_EQ(r.output.find("restart 1:"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("resumed from step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 3 took the state of step 3 from rank 0"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("recovered in process at step 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("in-process recovery done: every rank holds the state of step 3"),
            std::string::npos) << r.output;
  // The ledger: one in-process recovery, no checkpoint load, at most one step done again.
  auto report = nlohmann::json::parse(ReadFile(dir + "/report-fault.json"));
  ASSERT_EQ(report["lost"]["restarts"].size(), 1u) << report["lost"].dump();
  const auto& c = report["lost"]["restarts"][0];
  EXPECT_TRUE(c["in_process"].get<bool>()) << c.dump();
  EXPECT_TRUE(c["resumed"].get<bool>()) << c.dump();
  EXPECT_EQ(c["resumed_step"], 3) << c.dump();
  EXPECT_EQ(c["checkpoint_load_s"].get<double>(), 0) << c.dump();
  EXPECT_GT(c["state_from_peer_s"].get<double>(), 0) << c.dump();
  EXPECT_LE(c["recomputed_steps"].get<int>(), 1) << c.dump();
  // Bit for bit the run without the fault.
  auto a = nlohmann::json::parse(ReadFile(dir + "/m-clean.json"));
  auto b = nlohmann::json::parse(ReadFile(dir + "/m-fault.json"));
  EXPECT_EQ(a["param_digests"], b["param_digests"]);
  EXPECT_EQ(a["final_loss"].get<double>(), b["final_loss"].get<double>());
  EXPECT_EQ(b["param_digests"].size(), 4u);
  EXPECT_EQ(b["start_step"], 0);
}

// A kill in the first step (the state sent is the one every rank started with) and in the second
// (the first after DDP's buckets are laid out by their ready order): each recovered in process
// and ends bit for bit where the run without the fault does.
TEST(InProcessRecovery, AFaultInTheFirstOrSecondStepIsRecoveredInProcessToo) {
  const std::string dir = MakeTempDir();
  ProcResult clean = RunCommand(TrainUnet(dir, "clean", {}, {}, 4), {{"OMP_NUM_THREADS", "1"}},
                                std::chrono::seconds(240));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  const auto a = nlohmann::json::parse(ReadFile(dir + "/m-clean.json"));
  for (int step : {1, 2}) {
    const std::string tag = "fault" + std::to_string(step);
    ProcResult r = RunCommand(
        TrainUnet(dir, tag, {}, {"--fail-at-step", std::to_string(step), "--fail-how", "kill"}, 4),
        {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(
        r.output.find("rank 3 took the state of step " + std::to_string(step - 1) + " from rank 0"),
        std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("restart 1:"), std::string::npos) << r.output;
    const auto b = nlohmann::json::parse(ReadFile(dir + "/m-" + tag + ".json"));
    EXPECT_EQ(a["param_digests"], b["param_digests"]) << "kill at step " << step;
    EXPECT_EQ(b["param_digests"].size(), 4u);
  }
}

// Rank 0, the checkpoints' writer, lost after step 4's commit and before its save: the step is
// not done again, so the process that replaces it writes that checkpoint (chaos found a later
// restart resuming from step 10 of a fault at step 22: step 20's save had been lost so).
TEST(InProcessRecovery, ACheckpointWhoseWriterWasLostBeforeItsSaveIsWrittenByItsReplacement) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand(
      TrainUnet(dir, "lostsave", {}, {"--fail-at-step", "4", "--fail-how", "kill-before-save"}, 5),
      {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--fail-at-step 4: SIGKILL before the save as asked"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 0 took the state of step 4 from rank 1"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("checkpoint of step 4 missing (its writer was lost after the step): "
                          "saving it"),
            std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt-lostsave/ckpt-000000000004.dlrun")) << r.output;
  EXPECT_EQ(r.output.find("restart 1:"), std::string::npos) << r.output;
}

// --recovery restart: torchrun's way even for a program that declares in-process recovery.
TEST(InProcessRecovery, RecoveryRestartKeepsTorchrunsWay) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand(
      TrainUnet(dir, "restart", {"--recovery", "restart", "--max-restarts", "1"},
                {"--fail-at-step", "4", "--fail-how", "kill"}, 5),
      {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("in-process recovery"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  EXPECT_EQ(RankTables(r.output).size(), 2u) << r.output;
}

// The fallbacks end in the ordinary restart from the checkpoint, with the reason in one line,
// and the run still ends where the run without a fault would.
TEST(InProcessRecovery, AReplacementThatNeverJoinsFallsBackToTheRestart) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand(
      TrainUnet(dir, "hang", {"--max-restarts", "1", "--recovery-timeout", "4"},
                {"--fail-at-step", "4", "--fail-how", "kill", "--fail-replacement", "hang"}, 5),
      {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--fail-replacement hang: not joining"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("in-process recovery (generation 1) did not end within 4000 ms: "),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restarting from the checkpoint instead"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m-hang.json"));
  EXPECT_EQ(m["start_step"], 2);
}

TEST(InProcessRecovery, ReplicasThatDifferAreRefusedAndTheGroupRestarts) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand(
      TrainUnet(dir, "differs", {"--max-restarts", "1"},
                {"--fail-at-step", "4", "--fail-how", "kill", "--fail-replacement", "differs"}, 5),
      {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The line names the first parameter that differs.
  EXPECT_NE(r.output.find("in-process recovery failed (generation 1): recovery: rank(s) 3 hold "
                          "other parameters than rank 0 after the state transfer from rank 0, "
                          "first '"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("': not going on with replicas that differ"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m-differs.json"));
  EXPECT_EQ(m["start_step"], 2);
  EXPECT_EQ(m["param_digests"][0], m["param_digests"][3]);
}

// Under torchrun (which declares nothing to dlrun::worker: torchrun's own restart), a restarted
// C++ group meets at torchrun's agent store, its keys under the attempt's prefix, as
// torch.distributed's env:// does (TORCHELASTIC_USE_AGENT_STORE=True); it used to wait out the
// 5 min store timeout on the last attempt's Gloo addresses.
TEST(InProcessRecovery, UnderTorchrunARestartedCppGroupMeetsAtTheAgentsStore) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand(
      {TEST_PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
       "--max-restarts", "1", "--monitor-interval", "0.1", "--no-python", TRAIN_UNET_BIN,
       "--synthetic", "--base-channels", "4", "--max-steps", "4", "--checkpoint-every", "2",
       "--checkpoint-dir", dir + "/ckpt", "--fail-at-step", "3", "--metrics-json",
       dir + "/m.json"},
      {{"OMP_NUM_THREADS", "1"}, {"DLRUN_INIT_TIMEOUT", "60"}}, std::chrono::seconds(200));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
  EXPECT_EQ(m["start_step"], 2);
}

}  // namespace
}  // namespace dlrun::testing
