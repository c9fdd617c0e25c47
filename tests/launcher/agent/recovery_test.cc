// In-process recovery in the agent's loop (recovery_machine.h, in_process_recovery.cc;
// docs/RECOVERY.md): a worker of a program that declared it dies, the others keep running, the
// lost local rank starts again in the group's next generation, the survivors are told it on
// their control pipes; the fallbacks to the ordinary restart.
#include <signal.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/harness.h"
#include "launcher/rdzv/static_source.h"
#include "gtest/gtest.h"

namespace dlrun::launcher::testing {
namespace {

StepRecord Declared() {
  StepRecord r;
  r.kind = RecordKind::kDeclared;
  return r;
}

StepRecord FromPeer(int64_t step) {
  StepRecord r;
  r.kind = RecordKind::kFromPeer;
  r.step = step;
  r.step_s = 0.05;
  return r;
}

// Three workers that declare in-process recovery and step every second; local rank 1 of the
// first group is SIGKILLed at 2.5 s. A survivor answers the word with its "P" record after
// 50 ms; a replacement sends its own 200 ms after it starts unless `replacement_joins` is false.
// Everyone still running ends with 0 at 20 s of its own. `kills` false: no worker fails here.
void Declaring(Harness& h, bool replacement_joins, bool declares = true, bool kills = true) {
  h.options.pick_master_port = [](const std::string&) { return 45000; };
  h.options.recovery_timeout = seconds(5);
  h.procs.on_spawn = [=](FakeProcesses& f, FakeProcesses::Proc& p) {
    const bool replacement = p.spec.env.count("DLRUN_RECOVERY_GEN") != 0;
    if (declares) f.RecordAfter(p.pid, milliseconds(100), Declared());
    StepRecord s;
    s.samples = 1;
    s.step_s = 1;
    f.StepsEvery(p.pid, seconds(1), seconds(5), s);
    if (replacement && replacement_joins) f.RecordAfter(p.pid, milliseconds(200), FromPeer(2));
    if (kills && p.attempt == 0 && p.spec.local_rank == 1 && !replacement) {
      f.KilledAfter(p.pid, milliseconds(2500), SIGKILL);
    } else if (!replacement || replacement_joins) {
      f.ExitAfter(p.pid, seconds(20), 0);
    }
  };
  h.procs.on_tell = [](FakeProcesses& f, pid_t pid, const std::string&) {
    f.RecordAfter(pid, milliseconds(50), FromPeer(2));
  };
}

TEST(AgentInProcessRecovery, TheSurvivorsKeepRunningAndHearTheNewGroup) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true);
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/0), 0);
  ASSERT_EQ(h.procs.procs.size(), 4u);  // 3 workers and one replacement, no second group
  const auto& lost = h.procs.procs[1];
  const auto& replacement = h.procs.procs[3];
  EXPECT_EQ(replacement.spec.local_rank, 1);
  EXPECT_EQ(replacement.spec.env.at("DLRUN_RECOVERY_GEN"), "1");
  EXPECT_EQ(replacement.spec.env.at("MASTER_PORT"), "45000");
  EXPECT_EQ(replacement.spec.env.at("RANK"), "1");
  EXPECT_EQ(replacement.spec.env.at("TORCHELASTIC_RESTART_COUNT"), "0");
  // The two survivors heard the word; the lost one and the replacement did not.
  ASSERT_EQ(h.procs.told.size(), 2u);
  for (const auto& [pid, word] : h.procs.told) {
    EXPECT_NE(pid, lost.pid);
    EXPECT_NE(pid, replacement.pid);
    EXPECT_EQ(word, "regroup 1 45000\n");
  }
  // No survivor was stopped.
  for (int i : {0, 2}) EXPECT_TRUE(h.procs.SentTo(h.procs.procs[i].pid).empty()) << i;
  // A C++ program that declares it gets warm spares, one per local rank.
  EXPECT_EQ(h.procs.kept_spares.size(), 4u);  // three at the declarations, one for the replacement
  EXPECT_EQ(h.procs.kept_spares[0].spare_argv, h.options.argv);
}

// A Python program under --max-restarts 0 (plan.cc holds its bootstrap back): no spare at the
// start, one per local rank once the program declares in-process recovery, each the bootstrap.
TEST(AgentInProcessRecovery, HeldBackPythonSparesStartAtTheDeclaration) {
  Harness h(3);
  h.options.spare_argv_on_declaration = {"python3", "-u", "-c", "bootstrap", "train.py"};
  Declaring(h, /*replacement_joins=*/true);
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/0), 0);
  ASSERT_EQ(h.procs.kept_spares.size(), 4u);  // three at the declarations, one for the replacement
  for (const SpawnSpec& s : h.procs.kept_spares) {
    EXPECT_EQ(s.spare_argv, h.options.spare_argv_on_declaration);
  }
  // Without a declaration, none at all.
  Harness quiet(3);
  quiet.options.spare_argv_on_declaration = {"python3", "-u", "-c", "bootstrap", "train.py"};
  Declaring(quiet, /*replacement_joins=*/true, /*declares=*/false);
  quiet.RunStatic(/*max_restarts=*/0);
  EXPECT_TRUE(quiet.procs.kept_spares.empty());
}

TEST(AgentInProcessRecovery, AReplacementThatNeverSaysItHoldsTheStateEndsInTheRestart) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/false);
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 0);
  // Three workers, the replacement, then a second group of three after the recovery timed out.
  ASSERT_EQ(h.procs.procs.size(), 7u);
  EXPECT_EQ(h.procs.groups_started(), 2);
  // The survivors and the replacement were stopped (SIGTERM) when the 5 s bound passed.
  for (int i : {0, 2, 3}) {
    const auto s = h.procs.SentTo(h.procs.procs[i].pid);
    ASSERT_FALSE(s.empty()) << i;
    EXPECT_EQ(s[0].sig, SIGTERM) << i;
    EXPECT_GE(s[0].at, milliseconds(2500 + 5000)) << i;
  }
  EXPECT_EQ(h.procs.procs[4].spec.env.count("DLRUN_RECOVERY_GEN"), 0u);
  EXPECT_EQ(h.procs.procs[4].spec.env.at("TORCHELASTIC_RESTART_COUNT"), "1");
}

// A survivor refuses the recovery (it exits with 1 where it would send its "P" record): the
// group restarts from the checkpoint with --max-restarts 0, the restart the workers see
// (TORCHELASTIC_RESTART_COUNT 1) but not one of --max-restarts.
TEST(AgentInProcessRecovery, ARefusedRecoveryRestartsFromTheCheckpointWithoutMaxRestarts) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/false);
  h.procs.on_tell = [](FakeProcesses& f, pid_t pid, const std::string&) {
    f.ExitAfter(pid, milliseconds(50), 1);
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/0), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
  ASSERT_EQ(h.procs.procs.size(), 7u);
  EXPECT_EQ(h.procs.procs[4].spec.env.at("TORCHELASTIC_RESTART_COUNT"), "1");
}

// The same program failing again at the same step after that restart: no second uncounted
// restart (a bug would loop), the ordinary count ends the job.
TEST(AgentInProcessRecovery, AFailureAtTheStepOfTheLastFallbackIsCounted) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/false);
  auto declaring = h.procs.on_spawn;
  h.procs.on_spawn = [declaring](FakeProcesses& f, FakeProcesses::Proc& p) {
    declaring(f, p);
    if (p.attempt == 1 && p.spec.local_rank == 1) f.KilledAfter(p.pid, milliseconds(2500), SIGKILL);
  };
  h.procs.on_tell = [](FakeProcesses& f, pid_t pid, const std::string&) {
    f.ExitAfter(pid, milliseconds(50), 1);
  };
  EXPECT_NE(h.RunStatic(/*max_restarts=*/0), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
}

// A rank whose step records stop (hung) in a group that declared in-process recovery: the hang
// detection names it, dlrun kills it alone (SIGKILL, the others get no signal) and it is replaced
// in process like a dead one: no restart, the survivors told the new group.
TEST(AgentInProcessRecovery, AHungRankIsKilledAloneAndReplacedInProcess) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true);  // its options and its survivors' "P" records
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    const bool replacement = p.spec.env.count("DLRUN_RECOVERY_GEN") != 0;
    f.RecordAfter(p.pid, milliseconds(100), Declared());
    StepRecord s;
    s.samples = 1;
    s.step_s = 0.1;
    if (replacement) {
      f.RecordAfter(p.pid, milliseconds(200), FromPeer(2));
      f.ExitAfter(p.pid, seconds(20), 0);
    } else if (p.spec.local_rank == 1) {
      f.StepsEvery(p.pid, milliseconds(100), seconds(10), s);  // then silent: hung
    } else {
      f.StepsEvery(p.pid, milliseconds(100), seconds(95), s);
      f.ExitAfter(p.pid, seconds(100), 0);
    }
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/0), 0);
  EXPECT_EQ(h.procs.groups_started(), 1);
  const pid_t hung = h.procs.procs[1].pid;
  ASSERT_FALSE(h.procs.SentTo(hung).empty());
  EXPECT_EQ(h.procs.SentTo(hung)[0].sig, SIGKILL);
  for (int i : {0, 2}) EXPECT_TRUE(h.procs.SentTo(h.procs.procs[i].pid).empty()) << i;
  ASSERT_EQ(h.procs.procs.size(), 4u);
  EXPECT_EQ(h.procs.procs[3].spec.env.at("DLRUN_RECOVERY_GEN"), "1");
  EXPECT_EQ(h.procs.told.size(), 2u);
}

TEST(AgentInProcessRecovery, AProgramThatDidNotDeclareItRestartsAsUnderTorchrun) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/false);
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 0);
  EXPECT_TRUE(h.procs.told.empty());
  EXPECT_EQ(h.procs.groups_started(), 2);
  EXPECT_TRUE(h.procs.kept_spares.empty());
}

// A job that may span nodes whose nodes cannot regroup (no RegroupLink: a static multi-node
// rendezvous) restarts as before: no in-process recovery, no spares on declaration.
TEST(AgentInProcessRecovery, AJobThatMaySpanNodesRestartsAsBefore) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true);
  h.options.single_node_job = false;
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 0);
  EXPECT_TRUE(h.procs.told.empty());
  EXPECT_EQ(h.procs.groups_started(), 2);
  EXPECT_TRUE(h.procs.kept_spares.empty());
}

TEST(AgentInProcessRecovery, RecoveryRestartRestartsEvenADeclaringProgram) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true);
  h.options.recovery = AgentOptions::Recovery::kRestart;
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 0);
  EXPECT_TRUE(h.procs.told.empty());
  EXPECT_EQ(h.procs.groups_started(), 2);
  EXPECT_TRUE(h.procs.kept_spares.empty());
}

// A rank that has finished its work is not in the loop a recovery needs: a failure after it is
// the ordinary restart, no word to anyone.
TEST(AgentInProcessRecovery, AFailureAfterARankFinishedRestartsTheGroup) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/true, /*kills=*/false);
  auto declaring = h.procs.on_spawn;
  h.procs.on_spawn = [declaring](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.attempt == 0 && p.spec.local_rank == 0) {
      f.RecordAfter(p.pid, milliseconds(100), Declared());
      f.ExitAfter(p.pid, milliseconds(2000), 0);
    } else if (p.attempt == 0 && p.spec.local_rank == 1) {
      f.RecordAfter(p.pid, milliseconds(100), Declared());
      f.KilledAfter(p.pid, milliseconds(2500), SIGKILL);
    } else {
      declaring(f, p);
    }
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 0);
  EXPECT_TRUE(h.procs.told.empty());
  EXPECT_EQ(h.procs.groups_started(), 2);
  for (const auto& p : h.procs.procs) EXPECT_EQ(p.spec.env.count("DLRUN_RECOVERY_GEN"), 0u);
}

// A rank that finishes while a recovery waits for the state would never say it holds it: the
// recovery ends there, not at its bound (5 s here).
TEST(AgentInProcessRecovery, ARankThatFinishesDuringTheRecoveryEndsItAtOnce) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/false);
  auto declaring = h.procs.on_spawn;
  h.procs.on_spawn = [declaring](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.attempt == 0 && p.spec.local_rank == 0) {
      f.RecordAfter(p.pid, milliseconds(100), Declared());
      f.ExitAfter(p.pid, milliseconds(3000), 0);
    } else {
      declaring(f, p);
    }
  };
  h.procs.on_tell = [](FakeProcesses&, pid_t, const std::string&) {};  // no survivor answers
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
  // The survivor (local rank 2) and the replacement are stopped at rank 0's end, 3 s in.
  for (int i : {2, 3}) {
    const auto s = h.procs.SentTo(h.procs.procs[i].pid);
    ASSERT_FALSE(s.empty()) << i;
    EXPECT_EQ(s[0].sig, SIGTERM) << i;
    EXPECT_GE(s[0].at, milliseconds(3000)) << i;
    EXPECT_LT(s[0].at, milliseconds(2500 + 5000)) << i;
  }
}

// A program that reports no steps: the replacement's "P" record is its progress, so the same
// rank lost again after it holds a newer step is recovered in process again, not taken for a
// failure at the same step.
TEST(AgentInProcessRecovery, ARankLostAgainAfterItsStateFromAPeerIsRecoveredAgain) {
  Harness h(3);
  h.options.pick_master_port = [](const std::string&) { return 45000; };
  h.options.recovery_timeout = seconds(5);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    const auto gen = p.spec.env.find("DLRUN_RECOVERY_GEN");
    const int generation = gen == p.spec.env.end() ? 0 : std::stoi(gen->second);
    f.RecordAfter(p.pid, milliseconds(100), Declared());
    if (generation > 0) f.RecordAfter(p.pid, milliseconds(200), FromPeer(2 * generation));
    if (p.spec.local_rank == 1 && generation < 2) {
      f.KilledAfter(p.pid, milliseconds(2500), SIGKILL);  // no step records at all
    } else {
      f.ExitAfter(p.pid, seconds(20), 0);
    }
  };
  h.procs.on_tell = [](FakeProcesses& f, pid_t pid, const std::string& word) {
    f.RecordAfter(pid, milliseconds(50), FromPeer(word.rfind("regroup 1", 0) == 0 ? 2 : 4));
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/0), 0);
  EXPECT_EQ(h.procs.groups_started(), 1);
  ASSERT_EQ(h.procs.procs.size(), 5u);  // 3 workers, then local rank 1 twice more
  EXPECT_EQ(h.procs.procs[3].spec.env.at("DLRUN_RECOVERY_GEN"), "1");
  EXPECT_EQ(h.procs.procs[4].spec.env.at("DLRUN_RECOVERY_GEN"), "2");
}

RegroupLink::Notice MakeNotice(int generation, int port, std::vector<int> lost, std::string reason,
                               std::string asked_by = "this") {
  RegroupLink::Notice n;
  n.generation = generation;
  n.master_port = port;
  n.lost_ranks = std::move(lost);
  n.reason = std::move(reason);
  n.asked_by = std::move(asked_by);
  return n;
}

// Across nodes (RegroupLink; docs/RECOVERY.md, "Across nodes"): the job's regroup as a script.
// An ask is recorded and answered with `answer_port` (the port global rank 0's node posts; 0:
// not yet), or refused; from `remote_at` on, Latest() shows another node's loss.
class FakeRegroup final : public RegroupLink {
 public:
  explicit FakeRegroup(FakeClock& clock) : clock_(clock) {}
  void Watch(std::function<void()> wake) override { watched = true; }
  Notice Latest() override {
    if (remote_at && clock_.Elapsed() >= *remote_at && notice.generation == 0) notice = remote;
    if (!new_round_after_read || notice.generation == 0) return notice;
    remote_at.reset();  // the restart's new round begins with no regroup
    return std::exchange(notice, Notice{});
  }
  absl::StatusOr<Notice> Ask(int generation, const std::vector<int>& lost, int master_port,
                             const std::string& reason) override {
    asks.push_back(MakeNotice(generation, master_port, lost, reason));
    if (refuse) return absl::AbortedError("the regroup to generation 1 is under way");
    if (!lost.empty()) {
      notice = MakeNotice(generation, master_port > 0 ? master_port : answer_port, lost, reason);
    }
    if (lost.empty()) notice.master_port = master_port;
    return notice;
  }
  void SetInProcess(bool yes) override { in_process = yes; }
  std::string node_id() const override { return "this"; }

  bool watched = false, refuse = false, in_process = false, new_round_after_read = false;
  int answer_port = 46000;
  std::optional<milliseconds> remote_at;
  Notice remote, notice;
  std::vector<Notice> asks;

 private:
  FakeClock& clock_;
};

// Node 1 of 2 (ranks 3-5), or node 0 (ranks 0-2) with `holds_rank_zero`, of a job that can
// regroup.
int RunAcrossNodes(Harness& h, std::shared_ptr<FakeRegroup> regroup, bool holds_rank_zero,
                   int max_restarts = 1) {
  h.options.single_node_job = false;
  Assignment a;
  a.num_nodes = 2;
  a.node_rank = holds_rank_zero ? 0 : 1;
  a.rank_offset = holds_rank_zero ? 0 : 3;
  a.world_size = 6;
  a.local_world_size = h.options.nproc;
  JobLink link = MakeStaticSource(a, max_restarts, nullptr);
  link.regroup = std::move(regroup);
  return h.Run(std::move(link));
}

TEST(AgentInProcessRecovery, ALossOnANodeIsAskedOfTheJobAndReplacedOnceThePortIsPosted) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/false), 0);
  EXPECT_TRUE(regroup->watched);
  ASSERT_EQ(regroup->asks.size(), 1u);
  EXPECT_EQ(regroup->asks[0].generation, 1);
  EXPECT_EQ(regroup->asks[0].master_port, 0);  // global rank 0's node picks it
  EXPECT_EQ(regroup->asks[0].lost_ranks, std::vector<int>{4});
  EXPECT_NE(regroup->asks[0].reason.find("rank 4 (local rank 1"), std::string::npos)
      << regroup->asks[0].reason;
  ASSERT_EQ(h.procs.procs.size(), 4u);  // no second group
  const auto& replacement = h.procs.procs[3];
  EXPECT_EQ(replacement.spec.env.at("MASTER_PORT"), "46000");
  EXPECT_EQ(replacement.spec.env.at("DLRUN_RECOVERY_GEN"), "1");
  EXPECT_EQ(replacement.spec.env.at("RANK"), "4");
  ASSERT_EQ(h.procs.told.size(), 2u);
  for (const auto& [pid, word] : h.procs.told) EXPECT_EQ(word, "regroup 1 46000\n");
  EXPECT_EQ(h.procs.kept_spares.size(), 4u);  // warm spares across nodes too
}

// The node of global rank 0 sends its port with its own ask: the generation begins at once, not
// at the loop's next event.
TEST(AgentInProcessRecovery, TheNodeOfRankZeroBeginsAtOnceWithThePortItAskedWith) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true);
  std::optional<milliseconds> replaced_at;
  h.procs.on_spawn = [&, inner = h.procs.on_spawn](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.env.count("DLRUN_RECOVERY_GEN")) replaced_at = h.clock.Elapsed();
    inner(f, p);
  };
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/true), 0);
  ASSERT_EQ(regroup->asks.size(), 1u);
  EXPECT_EQ(regroup->asks[0].master_port, 45000);
  EXPECT_EQ(regroup->asks[0].lost_ranks, std::vector<int>{1});
  ASSERT_TRUE(replaced_at.has_value());
  EXPECT_EQ(*replaced_at, milliseconds(2500));  // the kill's moment
  ASSERT_EQ(h.procs.told.size(), 2u);
  for (const auto& [pid, word] : h.procs.told) EXPECT_EQ(word, "regroup 1 45000\n");
}

TEST(AgentInProcessRecovery, AnotherNodesLossRegroupsEverySurvivorHere) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/true, /*kills=*/false);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  regroup->remote_at = milliseconds(2500);
  regroup->remote = MakeNotice(1, 46000, {0}, "rank 0 (local rank 0, pid 7): SIGKILL", "node-a");
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/false), 0);
  EXPECT_TRUE(regroup->asks.empty());
  EXPECT_EQ(h.procs.procs.size(), 3u);  // nothing to replace here
  ASSERT_EQ(h.procs.told.size(), 3u);
  for (const auto& [pid, word] : h.procs.told) EXPECT_EQ(word, "regroup 1 46000\n");
  for (int i : {0, 1, 2}) EXPECT_TRUE(h.procs.SentTo(h.procs.procs[i].pid).empty()) << i;
}

TEST(AgentInProcessRecovery, TheNodeOfGlobalRankZeroPostsTheNewGroupsPort) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/true, /*kills=*/false);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  regroup->remote_at = milliseconds(2500);
  regroup->remote = MakeNotice(1, 0, {4}, "rank 4 (local rank 1, pid 9): SIGKILL", "node-b");
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/true), 0);
  ASSERT_EQ(regroup->asks.size(), 1u);
  EXPECT_EQ(regroup->asks[0].generation, 1);
  EXPECT_EQ(regroup->asks[0].master_port, 45000);  // its pick_master_port
  EXPECT_TRUE(regroup->asks[0].lost_ranks.empty());
  ASSERT_EQ(h.procs.told.size(), 3u);
  for (const auto& [pid, word] : h.procs.told) EXPECT_EQ(word, "regroup 1 45000\n");
}

TEST(AgentInProcessRecovery, AnAskTheJobRefusesEndsInTheRestart) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  regroup->refuse = true;
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/false), 0);
  EXPECT_EQ(regroup->asks.size(), 1u);
  EXPECT_TRUE(h.procs.told.empty());
  EXPECT_EQ(h.procs.groups_started(), 2);
}

// A node lost whole (node 0, ranks 0-2): the host leaves it out and the job goes on with this
// node alone, which now holds global rank 0, posts the port and tells each rank its new place.
TEST(AgentInProcessRecovery, ANodeLostElsewhereGivesEveryRankHereItsNewPlace) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/true, /*kills=*/false);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  regroup->remote_at = milliseconds(2500);
  regroup->remote = MakeNotice(1, 0, {}, "lost 1 node(s): host-a (node-a, its connection closed)",
                               "the rendezvous host");
  regroup->remote.places = {{"this", 0, 0}};
  regroup->remote.world_size = 3;
  regroup->remote.master_addr = "10.0.0.2";
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/false), 0);
  EXPECT_TRUE(regroup->in_process);     // said once every worker here declared it
  ASSERT_EQ(regroup->asks.size(), 1u);  // the port, from the new rank 0's node
  EXPECT_EQ(regroup->asks[0].master_port, 45000);
  EXPECT_EQ(h.procs.procs.size(), 3u);  // nothing replaced, nothing restarted
  ASSERT_EQ(h.procs.told.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& [pid, word] = h.procs.told[i];
    const int local = pid == h.procs.procs[0].pid ? 0 : pid == h.procs.procs[1].pid ? 1 : 2;
    EXPECT_EQ(word, absl::StrCat("regroup 1 45000 ", local, " 3 10.0.0.2\n"));
  }
}

TEST(AgentInProcessRecovery, ANodeTheJobGoesOnWithoutRestarts) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/true, /*kills=*/false);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  regroup->remote_at = milliseconds(2500);
  regroup->remote =
      MakeNotice(1, 0, {}, "lost 1 node(s): this host (missed heartbeats)", "the rendezvous host");
  regroup->remote.places = {{"node-a", 0, 0}};
  regroup->remote.world_size = 3;
  regroup->new_round_after_read = true;
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/false), 0);
  EXPECT_TRUE(regroup->asks.empty());
  EXPECT_TRUE(h.procs.told.empty());
  EXPECT_EQ(h.procs.groups_started(), 2);
}

// A node admitted into the running round (docs/RECOVERY.md, "A node that joins"): its join's
// assignment names the generation, and every local rank starts as a replacement of it.
TEST(AgentInProcessRecovery, AnAdmittedNodeStartsEveryRankAsAReplacementOfItsGeneration) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/true, /*kills=*/false);
  h.options.single_node_job = false;
  Assignment a;
  a.num_nodes = 2;
  a.node_rank = 1;
  a.rank_offset = 3;
  a.world_size = 6;
  a.local_world_size = 3;
  a.master_addr = "10.0.0.1";
  a.master_port = 47000;
  a.recovery_generation = 2;
  JobLink link = MakeStaticSource(a, /*max_restarts=*/0, nullptr);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  link.regroup = regroup;
  EXPECT_EQ(h.Run(std::move(link)), 0);
  ASSERT_EQ(h.procs.procs.size(), 3u);  // one group, nothing restarted
  for (int lr = 0; lr < 3; ++lr) {
    const auto& env = h.procs.procs[lr].spec.env;
    EXPECT_EQ(env.at("DLRUN_RECOVERY_GEN"), "2") << lr;
    EXPECT_EQ(env.at("MASTER_PORT"), "47000") << lr;
    EXPECT_EQ(env.at("RANK"), absl::StrCat(3 + lr)) << lr;
    EXPECT_EQ(env.at("WORLD_SIZE"), "6") << lr;
  }
  EXPECT_TRUE(h.procs.told.empty());  // nobody here to tell: they start in the generation
  EXPECT_TRUE(regroup->asks.empty());
}

// Another node admitted: every rank here is told its place in the grown group, and this node,
// which holds global rank 0, posts the port (that post answers the new node's join).
TEST(AgentInProcessRecovery, ANodeAdmittedElsewhereGrowsTheGroupHere) {
  Harness h(3);
  Declaring(h, /*replacement_joins=*/true, /*declares=*/true, /*kills=*/false);
  auto regroup = std::make_shared<FakeRegroup>(h.clock);
  regroup->remote_at = milliseconds(2500);
  regroup->remote = MakeNotice(1, 0, {}, "node host-c (node-c) joined the running round",
                               "the rendezvous host");
  regroup->remote.places = {{"this", 0, 0}, {"node-b", 1, 3}, {"node-c", 2, 6}};
  regroup->remote.world_size = 9;
  regroup->remote.master_addr = "127.0.0.1";
  EXPECT_EQ(RunAcrossNodes(h, regroup, /*holds_rank_zero=*/true), 0);
  ASSERT_EQ(regroup->asks.size(), 1u);
  EXPECT_EQ(regroup->asks[0].master_port, 45000);
  EXPECT_TRUE(regroup->asks[0].lost_ranks.empty());
  EXPECT_EQ(h.procs.procs.size(), 3u);  // nothing replaced, nothing restarted
  ASSERT_EQ(h.procs.told.size(), 3u);
  for (const auto& [pid, word] : h.procs.told) {
    const int local = pid == h.procs.procs[0].pid ? 0 : pid == h.procs.procs[1].pid ? 1 : 2;
    EXPECT_EQ(word, absl::StrCat("regroup 1 45000 ", local, " 9 127.0.0.1\n"));
  }
}

}  // namespace
}  // namespace dlrun::launcher::testing
