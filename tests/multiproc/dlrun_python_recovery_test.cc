// In-process recovery of a Python program (python/dlrun_recovery.py; docs/RECOVERY.md, "A fault
// costs one step"): a 4-rank gloo DDP trainer (tests/python/recoverable_train.py) whose last
// rank is SIGKILLed keeps its other three processes, the lost rank takes the state from a
// survivor, no step is done twice, and the run ends bit-identical to the run without a fault.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <cctype>
#include <set>
#include <sstream>

#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

struct TrainRun {
  ProcResult result;
  std::map<int, std::set<int>> pids;     // rank -> the pids that said "rank R pid P"
  std::map<int, std::string> digests;    // rank -> its last digest
  nlohmann::json report;
};

TrainRun Train(const std::string& dir, const std::string& tag, int kill_step,
               std::map<std::string, std::string> env = {}) {
  env.insert({{"PYTHON_EXEC", TEST_PYTHON},
              {"PYTHONPATH", std::string(SOURCE_DIR) + "/python"},
              {"OMP_NUM_THREADS", "1"},
              {"CKPT_DIR", dir + "/ckpt-" + tag},
              {"CKPT_EVERY", "5"}});
  if (kill_step >= 0) {
    env["KILL_RANK"] = "3";
    env["KILL_STEP"] = std::to_string(kill_step);
  }
  TrainRun run;
  run.result = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "4", "--max-restarts",
                           "1", "--report-json", dir + "/report-" + tag + ".json",
                           std::string(SOURCE_DIR) + "/tests/python/recoverable_train.py", "24",
                           "0.02"},
                          env, std::chrono::seconds(240));
  // Lines "rank R pid P" and "rank R digest D recoveries K" (behind dlrun's "[rank R]: ").
  std::istringstream lines(run.result.output);
  for (std::string line; std::getline(lines, line);) {
    for (const char* key : {" pid ", " digest "}) {
      const size_t at = line.find(key);
      const size_t r = at == std::string::npos ? at : line.rfind("rank ", at);
      if (r == std::string::npos || at != r + 6 || !std::isdigit(line[r + 5])) continue;
      const int rank = line[r + 5] - '0';
      std::istringstream value(line.substr(at + std::string(key).size()));
      std::string v;
      value >> v;
      if (std::string(key) == " pid ") {
        run.pids[rank].insert(std::stoi(v));
      } else {
        run.digests[rank] = v;
      }
    }
  }
  if (run.result.exit_code == 0) {
    run.report = nlohmann::json::parse(ReadFile(dir + "/report-" + tag + ".json"));
  }
  return run;
}

TEST(PythonInProcessRecovery, AKilledRankCostsNoStepAndTheRunEndsBitIdentical) {
  const std::string dir = MakeTempDir();
  const TrainRun clean = Train(dir, "clean", -1);
  ASSERT_EQ(clean.result.exit_code, 0) << clean.result.output;
  ASSERT_EQ(clean.digests.size(), 4u) << clean.result.output;
  const TrainRun fault = Train(dir, "fault", 16);
  const std::string& out = fault.result.output;
  ASSERT_EQ(fault.result.exit_code, 0) << out;
  ASSERT_NE(out.find("rank 3 killed at"), std::string::npos) << out;
  EXPECT_NE(out.find("in-process recovery: the 3 other rank(s) keep running, local rank 3 as pid"),
            std::string::npos) << out;
  EXPECT_NE(out.find("dlrun_recovery: rank 3 took the state of step 15 from rank 0"),
            std::string::npos) << out;
  EXPECT_NE(out.find("in-process recovery done: every rank holds the state of step 15"),
            std::string::npos) << out;
  EXPECT_EQ(out.find("restart 1:"), std::string::npos) << out;
  EXPECT_EQ(out.find("resumed from step"), std::string::npos) << out;
  // The survivors' processes are those of the start; the lost rank has a second one.
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(fault.pids.at(rank).size(), 1u) << out;
  EXPECT_EQ(fault.pids.at(3).size(), 2u) << out;
  // Every rank ends where the run without the fault ended, bit for bit.
  ASSERT_EQ(fault.digests.size(), 4u) << out;
  for (const auto& [rank, digest] : fault.digests) {
    EXPECT_EQ(digest, clean.digests.at(0)) << "rank " << rank << "\n" << out;
  }
  // The ledger: in process, no checkpoint read, nothing computed again.
  ASSERT_EQ(fault.report["lost"]["restarts"].size(), 1u) << fault.report["lost"].dump();
  const auto& c = fault.report["lost"]["restarts"][0];
  EXPECT_TRUE(c["in_process"].get<bool>()) << c.dump();
  EXPECT_EQ(c["resumed_step"], 15) << c.dump();
  EXPECT_EQ(c["checkpoint_load_s"].get<double>(), 0) << c.dump();
  EXPECT_GT(c["state_from_peer_s"].get<double>(), 0) << c.dump();
  EXPECT_LE(c["recomputed_steps"].get<int>(), 1) << c.dump();
  // The replacement was forked from the node's fork server (the default for Python), and the
  // report's line says so.
  EXPECT_EQ(c["started"]["forked"], 1) << c.dump();
  EXPECT_EQ(c["started"]["cold"], 0) << c.dump();
  EXPECT_NE(out.find(" (forked), state from peer "), std::string::npos) << out;
}

// A fault in the first step (no rank has finished one: the replacement takes the state every rank
// started with) and one in the second (the survivors rebuild DDP's buckets as it begins): each
// recovered in process, and each run ends bit-identical to the run without a fault.
TEST(PythonInProcessRecovery, AFaultInTheFirstOrSecondStepIsRecoveredInProcessToo) {
  const std::string dir = MakeTempDir();
  const TrainRun clean = Train(dir, "clean", -1);
  ASSERT_EQ(clean.result.exit_code, 0) << clean.result.output;
  for (int kill_step : {0, 1}) {
    const std::string tag = "fault" + std::to_string(kill_step);
    const TrainRun fault = Train(dir, tag, kill_step);
    const std::string& out = fault.result.output;
    ASSERT_EQ(fault.result.exit_code, 0) << out;
    EXPECT_NE(out.find("in-process recovery done: every rank holds the state of step " +
                       std::to_string(std::max(kill_step - 1, 0))),
              std::string::npos) << out;
    EXPECT_EQ(out.find("restart 1:"), std::string::npos) << out;
    // The workers name the step as the agent does: step 0 before any step is whole, not -1.
    EXPECT_EQ(out.find("state of step -1"), std::string::npos) << out;
    ASSERT_EQ(fault.digests.size(), 4u) << out;
    for (const auto& [rank, digest] : fault.digests) {
      EXPECT_EQ(digest, clean.digests.at(0)) << "kill at step " << kill_step << ", rank " << rank
                                             << "\n" << out;
    }
  }
}

// A replacement whose parameters differ from its peers' after the transfer: every rank refuses
// to go on, in one line, and the group restarts from the checkpoint and ends where the run
// without a fault does.
TEST(PythonInProcessRecovery, ReplicasThatDifferAreRefusedAndTheGroupRestarts) {
  const std::string dir = MakeTempDir();
  const TrainRun clean = Train(dir, "clean", -1);
  ASSERT_EQ(clean.result.exit_code, 0) << clean.result.output;
  const TrainRun r = Train(dir, "differs", 16, {{"FAIL_REPLACEMENT", "differs"}});
  const std::string& out = r.result.output;
  ASSERT_EQ(r.result.exit_code, 0) << out;
  EXPECT_NE(out.find("FAIL_REPLACEMENT=differs: parameters changed"), std::string::npos) << out;
  // The replacement finds it first and exits at once (the survivors are stopped then).
  EXPECT_NE(out.find("rank(s) 3 hold other values than rank 0 after the state transfer from "
                     "rank 0, first the parameter '0.weight': not going on with replicas that "
                     "differ"),
            std::string::npos) << out;
  EXPECT_EQ(out.find("nanobind: leaked"), std::string::npos) << out;
  EXPECT_NE(out.find("restart 1:"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 0 resumed from step 14"), std::string::npos) << out;
  // The checkpoint restart in the recovery's place finds a ready process for every rank.
  ASSERT_FALSE(r.report["lost"]["restarts"].empty()) << r.report.dump();
  const auto& started = r.report["lost"]["restarts"].back()["started"];
  EXPECT_EQ(started["forked"].get<int>() + started["spare"].get<int>(), 4) << r.report.dump();
  ASSERT_EQ(r.digests.size(), 4u) << out;
  for (const auto& [rank, digest] : r.digests) {
    EXPECT_EQ(digest, clean.digests.at(0)) << "rank " << rank << "\n" << out;
  }
}

// Without dlrun's control pipe (--recovery restart) the wrapper changes nothing: the group
// restarts as torchrun's would, and the program, which keeps no checkpoint, starts over.
TEST(PythonInProcessRecovery, RecoveryRestartRestartsTheGroup) {
  const std::string dir = MakeTempDir();
  std::map<std::string, std::string> env = {{"PYTHON_EXEC", TEST_PYTHON},
                                            {"PYTHONPATH", std::string(SOURCE_DIR) + "/python"},
                                            {"OMP_NUM_THREADS", "1"}, {"KILL_RANK", "1"},
                                            {"KILL_STEP", "3"}};
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--recovery",
                             "restart", "--max-restarts", "1",
                             std::string(SOURCE_DIR) + "/tests/python/recoverable_train.py", "5"},
                            env, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("in-process recovery"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restart 1:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 digest"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dlrun::testing
