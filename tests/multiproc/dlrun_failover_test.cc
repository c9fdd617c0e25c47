// Rendezvous host failover with real agents on loopback (docs/FAILOVER.md): the hosting agent
// is SIGKILLed (its workers die with it, as on a lost node) and the job goes on with the
// survivors from its newest checkpoint; a partitioned host that comes back joins the newer
// host instead of forking the job.
#include <signal.h>

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

constexpr auto kFailoverDeadline = std::chrono::seconds(90);
constexpr int kSteps = 60;

// A worker that makes kSteps steps of 50 ms, resuming from DIR/ckpt (written atomically by
// rank 0 after each step, with one line per step in DIR/steps: "STEP RESTARTS WORLD_SIZE").
// The step line goes first: a worker stopped between the two writes then redoes a recorded
// step, instead of checkpointing a step that no line records (seen under TSan's slowness).
std::vector<std::string> Worker(const std::string& dir, int steps = kSteps) {
  return {"sh", "-c",
          absl::StrCat("s=0; [ -f ", dir, "/ckpt ] && s=$(cat ", dir, "/ckpt); while [ $s -lt ",
                       steps, " ]; do s=$((s+1)); sleep 0.05; if [ $RANK = 0 ]; then echo $s ",
                       "$TORCHELASTIC_RESTART_COUNT $WORLD_SIZE >> ", dir, "/steps; echo $s > ",
                       dir, "/ckpt.$$ && mv ", dir, "/ckpt.$$ ", dir, "/ckpt; fi; echo step $s; ",
                       "done")};
}

std::vector<std::string> Agent(const std::string& endpoints, const std::string& nnodes,
                               const std::vector<std::string>& program) {
  std::vector<std::string> cmd = {DLRUN_BIN, "--nnodes", nnodes, "--nproc-per-node", "1",
                                  "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoints,
                                  "--rdzv-id", "failover-job", "--max-restarts", "5",
                                  "--rdzv-conf", "heartbeat_interval=0.2,last_call_timeout=1"};
  cmd.insert(cmd.end(), program.begin(), program.end());
  return cmd;
}

const std::map<std::string, std::string> kEnv = {{"DLRUN_RDZV_TOKEN", "test-token-123"},
                                                  {"OMP_NUM_THREADS", "1"}};

// Every step 1..steps was completed by some rank 0, and the checkpoint reached the end.
void ExpectEveryStepDone(const std::string& dir, int steps = kSteps) {
  std::set<int> done;
  for (absl::string_view line : absl::StrSplit(ReadFile(dir + "/steps"), '\n', absl::SkipEmpty())) {
    done.insert(std::stoi(std::string(line.substr(0, line.find(' ')))));
  }
  for (int s = 1; s <= steps; ++s) EXPECT_TRUE(done.count(s)) << "step " << s << " never ran";
  EXPECT_EQ(ReadFile(dir + "/ckpt"), absl::StrCat(steps, "\n"));
}

// Waits until `s` has printed `n` step lines in all.
bool WaitForSteps(Started& s, size_t n) {
  return ReadUntil(s, "]: step ", static_cast<int>(n), kFailoverDeadline);
}

TEST(DlrunFailover, ThreeAgentsSurviveLosingTheHostAndThenTheNextHost) {
  const std::string dir = MakeTempDir();
  const std::string ep = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const auto cmd = Agent(ep, "1:3", Worker(dir));
  Started agents[3];
  agents[0] = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(agents[0], "hosting the rendezvous", 1, kFailoverDeadline))
      << agents[0].output;
  agents[1] = StartCommand(cmd, kEnv);
  agents[2] = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(agents[0], "world size 3", 1, kFailoverDeadline)) << agents[0].output;
  ASSERT_TRUE(WaitForSteps(agents[0], 5)) << agents[0].output;

  // Lose the host (and its worker, which dies with its agent).
  kill(agents[0].pid, SIGKILL);
  FinishCommand(agents[0], kFailoverDeadline);
  int next_host = -1;
  for (int i : {1, 2}) {
    ASSERT_TRUE(ReadUntil(agents[i], "world size 2", 1, kFailoverDeadline)) << agents[i].output;
    if (agents[i].output.find("taking over the rendezvous") != std::string::npos) next_host = i;
  }
  ASSERT_NE(next_host, -1) << agents[1].output << agents[2].output;
  const int last = 3 - next_host;
  EXPECT_EQ(agents[last].output.find("taking over the rendezvous"), std::string::npos);
  EXPECT_NE(agents[last].output.find("restart 1: node"), std::string::npos) << agents[last].output;
  const size_t steps_so_far = Count(agents[next_host].output, "]: step ");
  ASSERT_TRUE(WaitForSteps(agents[next_host], steps_so_far + 5)) << agents[next_host].output;

  // Then lose the new host: the last agent hosts and finishes alone.
  kill(agents[next_host].pid, SIGKILL);
  FinishCommand(agents[next_host], kFailoverDeadline);
  const int rc = FinishCommand(agents[last], kFailoverDeadline);
  EXPECT_EQ(rc, 0) << agents[last].output;
  EXPECT_NE(agents[last].output.find("taking over the rendezvous"), std::string::npos)
      << agents[last].output;
  EXPECT_NE(agents[last].output.find("restart 2: node 0 of 1, world size 1"), std::string::npos)
      << agents[last].output;
  ExpectEveryStepDone(dir);
}

TEST(DlrunFailover, BelowTheMinimumNodesAfterHostLossTheJobEndsNamingIt) {
  const std::string dir = MakeTempDir();
  const std::string ep = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const auto cmd = Agent(ep, "2:2", Worker(dir));
  Started host = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(host, "hosting the rendezvous", 1, kFailoverDeadline)) << host.output;
  Started other = StartCommand(cmd, kEnv);
  ASSERT_TRUE(WaitForSteps(other, 3)) << other.output;
  // Rank 0 runs on the host and checkpoints before it prints a step: the sh workers do not
  // synchronise, so the other node's steps alone do not say that a checkpoint exists yet
  // (seen under TSan's slowness).
  ASSERT_TRUE(WaitForSteps(host, 1)) << host.output;
  kill(host.pid, SIGKILL);
  FinishCommand(host, kFailoverDeadline);
  EXPECT_EQ(FinishCommand(other, kFailoverDeadline), 1) << other.output;
  EXPECT_NE(other.output.find("rendezvous host lost: " + ep + " stopped answering and 1 node(s) "
                              "of round 1 are left, below the minimum of 2 (--nnodes); "
                              "checkpoints are kept"),
            std::string::npos)
      << other.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt"));
}

// A failure that repeats on one node (rank 1's CUDA OOM before any step, twice) ends the whole
// job after the second attempt, with restarts left: the other node is told to stop, not to
// restart.
TEST(DlrunFailover, AFailureThatRepeatsOnOneNodeStopsEveryNode) {
  const std::string ep = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const auto cmd = Agent(ep, "2:2", {"sh", "-c", "if [ $RANK = 1 ]; then echo 'torch."
                                     "OutOfMemoryError: CUDA out of memory.' >&2; exit 1; fi; "
                                     "sleep 60"});
  Started host = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(host, "hosting the rendezvous", 1, kFailoverDeadline)) << host.output;
  Started other = StartCommand(cmd, kEnv);
  const int rc_other = FinishCommand(other, kFailoverDeadline);
  const int rc_host = FinishCommand(host, kFailoverDeadline);
  const std::string both = host.output + other.output;
  EXPECT_EQ(rc_other, 1) << other.output;
  EXPECT_EQ(rc_host, 1) << host.output;
  EXPECT_EQ(Count(both, "rank 1 failed the same way twice (cuda_oom before its first step): "
                        "not restarting"),
            1u) << both;
  EXPECT_NE(both.find("it repeats the last failure, so no restart"), std::string::npos) << both;
  EXPECT_EQ(Count(both, "restarting 1 of 5"), 1u) << both;
  EXPECT_EQ(Count(both, "restarting 2 of 5"), 0u) << both;
}

TEST(DlrunFailover, AnExplicitCandidateListFailsOverToTheNextEntry) {
  const std::string dir = MakeTempDir();
  const std::string ep1 = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const std::string ep2 = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const auto cmd = Agent(ep1 + "," + ep2, "1:2", Worker(dir));
  Started host = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(host, "hosting the rendezvous on " + ep1, 1, kFailoverDeadline))
      << host.output;
  Started other = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(other, "world size 2", 1, kFailoverDeadline)) << other.output;
  ASSERT_TRUE(WaitForSteps(other, 3)) << other.output;
  kill(host.pid, SIGKILL);
  FinishCommand(host, kFailoverDeadline);
  EXPECT_EQ(FinishCommand(other, kFailoverDeadline), 0) << other.output;
  EXPECT_NE(other.output.find("taking over the rendezvous at " + ep2 + " (epoch 2)"),
            std::string::npos)
      << other.output;
  ExpectEveryStepDone(dir);
}

TEST(DlrunFailover, ACandidateListThatDiffersBetweenAgentsIsAnErrorNamingBoth) {
  const std::string ep1 = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const std::string ep2 = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const std::string ep3 = absl::StrCat("127.0.0.1:", FreeTcpPort());
  Started host = StartCommand(Agent(ep1 + "," + ep2, "2", {"true"}), kEnv);
  ASSERT_TRUE(ReadUntil(host, "hosting the rendezvous", 1, kFailoverDeadline)) << host.output;
  ProcResult other = RunCommand(Agent(ep1 + "," + ep3, "2", {"true"}), kEnv, kFailoverDeadline);
  kill(host.pid, SIGTERM);
  FinishCommand(host, kFailoverDeadline);
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_NE(other.output.find("the rendezvous candidate lists disagree: this host has '" + ep1 +
                              "," + ep2 + "'"),
            std::string::npos)
      << other.output;
  EXPECT_NE(other.output.find("has '" + ep1 + "," + ep3 + "'"), std::string::npos) << other.output;
}

TEST(DlrunFailover, APartitionedHostThatComesBackJoinsTheNewerHost) {
  // The host's agent is frozen (SIGSTOP: to the others it is a host cut off by a partition)
  // for longer than the liveness limit: the other agent takes over at the second candidate
  // (epoch 2). When the host runs again it learns of epoch 2 by asking the candidates, steps
  // down, and its side re-joins: one job of two nodes at epoch 2.
  const std::string dir = MakeTempDir();
  const std::string ep1 = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const std::string ep2 = absl::StrCat("127.0.0.1:", FreeTcpPort());
  const auto cmd = Agent(ep1 + "," + ep2, "1:2", Worker(dir, 4 * kSteps));
  Started host = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(host, "hosting the rendezvous on " + ep1, 1, kFailoverDeadline))
      << host.output;
  Started other = StartCommand(cmd, kEnv);
  ASSERT_TRUE(ReadUntil(other, "world size 2", 1, kFailoverDeadline)) << other.output;
  kill(host.pid, SIGSTOP);
  ASSERT_TRUE(ReadUntil(other, "taking over the rendezvous at " + ep2, 1, kFailoverDeadline))
      << other.output;
  ASSERT_TRUE(ReadUntil(other, "world size 1", 1, kFailoverDeadline)) << other.output;
  kill(host.pid, SIGCONT);
  ASSERT_TRUE(ReadUntil(host, "stepping down", 1, kFailoverDeadline)) << host.output;
  // Healed: the other agent (host of epoch 2) runs a round of both nodes again.
  ASSERT_TRUE(ReadUntil(other, "world size 2", 2, kFailoverDeadline))
      << other.output << host.output;
  EXPECT_EQ(FinishCommand(other, kFailoverDeadline), 0) << other.output;
  EXPECT_EQ(FinishCommand(host, kFailoverDeadline), 0) << host.output;
  EXPECT_NE(host.output.find("joining the newer rendezvous host at " + ep2), std::string::npos)
      << host.output;
  ExpectEveryStepDone(dir, 4 * kSteps);
}

}  // namespace
}  // namespace dlrun::testing
