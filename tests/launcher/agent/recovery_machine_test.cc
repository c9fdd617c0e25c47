// The recovery state machine (launcher/recovery/recovery_machine.h) walked row by row on a fake
// clock: from each state, each event, the decision and the state after. Every fallback that
// docs/RECOVERY.md lists is a row ("a failure during it" covers the digests that differ: the
// ranks throw, and a rank's failure during a recovery ends it).
#include "launcher/recovery/recovery_machine.h"

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dlrun::launcher::recovery_machine_test {
namespace {

using Kind = RecoveryMachine::Decision::Kind;
using Phase = RecoveryMachine::Phase;
using Decision = RecoveryMachine::Decision;
using Notice = RegroupLink::Notice;
using std::chrono::milliseconds;

// A node of three local ranks (pids 100-102, global ranks 0-2 or 4-6) on a fake clock.
struct Walk {
  RecoveryMachine::Config config{.asked_for = true, .single_node_job = true,
                                 .can_regroup = false, .timeout = milliseconds(5000)};
  SteadyTime now{};
  Assignment current;
  std::vector<RecoveryMachine::Member> members{{0, 100, true, true}, {1, 101, true, true},
                                               {2, 102, true, true}};
  std::vector<WorkerExit> exits;
  int64_t last_step = 7;
  RecoveryMachine m{config};

  // The same node as one of several over dlrun's rendezvous; `rank0`: it holds global rank 0.
  static Walk AcrossNodes(bool rank0) {
    Walk w;
    w.config.single_node_job = false;
    w.config.can_regroup = true;
    w.current.rank_offset = rank0 ? 0 : 4;
    w.current.world_size = 8;
    w.m = RecoveryMachine(w.config);
    w.m.GroupStarted(0, {100, 101, 102}, w.now);
    return w;
  }
  void Advance(milliseconds d) { now += d; }
  WorkerExit Exit(int local_rank, int code) {
    WorkerExit e;
    e.local_rank = local_rank;
    e.global_rank = current.rank_offset + local_rank;
    e.pid = 100 + local_rank;
    e.exit_code = code;
    return e;
  }
  // Local rank 1 fails.
  Decision Fail(bool stopping = false) {
    members[1].alive = false;
    exits.push_back(Exit(1, 1));
    return m.Failed(members, exits, current, stopping, [this](int) { return last_step; });
  }
  // One node: the failure recovered, generation 1 begun with a replacement of pid 103.
  Decision Begin() {
    Decision d = Fail();
    d.fault = now;
    d.said = {"rank 1: exit code 1"};
    d.next = current;
    d.next.master_port = 45000;
    members[1] = {1, 103, true, true};
    exits.clear();
    return m.Began(true, d, {100, 103, 102}, last_step);
  }
  Decision Ask(absl::Status answer = absl::OkStatus()) {
    Decision d = Fail();
    return m.Asked(answer, d.lost, {"rank 5: exit code 1"}, now);
  }
  Decision Notify(Notice n) { return m.Noticed(n, current, "node-b", members, now); }
};

Notice Regroup(int generation, int port, std::string asked_by = "node-a") {
  Notice n;
  n.generation = generation;
  n.master_port = port;
  n.reason = "rank 1 lost";
  n.asked_by = std::move(asked_by);
  return n;
}

struct Row {
  const char* name;
  std::function<Decision(Walk&)> run;  // from a fresh Walk to the event under test
  Kind kind;
  Phase after;
  const char* why = "";  // a part of the decision's line
  std::function<void(const Walk&, const Decision&)> also = nullptr;
};

std::vector<Row> Rows() {
  return {
      // Healthy, one node.
      {"healthy: a failure of a declaring program is recovered",
       [](Walk& w) { return w.Fail(); }, Kind::kRecover, Phase::kHealthy, "",
       [](const Walk&, const Decision& d) {
         EXPECT_EQ(d.generation, 1);
         EXPECT_TRUE(d.needs_port);
         ASSERT_EQ(d.lost.size(), 1u);
         EXPECT_EQ(d.lost[0].local_rank, 1);
       }},
      {"healthy: a program that did not declare it restarts silently",
       [](Walk& w) {
         for (auto& m : w.members) m.recoverable = false;
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack},
      {"healthy: --recovery restart restarts silently",
       [](Walk& w) {
         w.config.asked_for = false;
         w.m = RecoveryMachine(w.config);
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack},
      {"healthy: a static multi-node job cannot regroup",
       [](Walk& w) {
         w.config.single_node_job = false;
         w.m = RecoveryMachine(w.config);
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack, "this job's nodes cannot regroup"},
      {"healthy: a failure while the group is being stopped",
       [](Walk& w) { return w.Fail(/*stopping=*/true); }, Kind::kFallBack, Phase::kFallingBack,
       "the group is being stopped"},
      {"healthy: a local rank that did not declare it",
       [](Walk& w) {
         w.members[2].recoverable = false;
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack, "local rank 2 did not declare in-process recovery"},
      {"healthy: a rank that finished its work already",
       [](Walk& w) {
         w.exits.push_back(w.Exit(0, 0));
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack, "rank 0 already finished its work"},
      {"healthy: a failure with no recovery before it names no earlier fault",
       [](Walk& w) {
         w.Begin();
         for (pid_t p : {100, 103, 102}) w.m.StateFromPeer(p, 7, w.now);
         w.exits = {w.Exit(0, 0)};
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack, "rank 0 already finished its work",
       [](const Walk& w, const Decision&) { EXPECT_EQ(w.m.recovering_from(), ""); }},
      {"healthy: no rank survived",
       [](Walk& w) {
         w.exits = {w.Exit(0, 1), w.Exit(2, 1)};
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack, "no rank survived"},
      {"healthy: the same rank fails at the same step after a recovery",
       [](Walk& w) {
         w.Begin();
         w.m.StateFromPeer(100, 7, w.now);
         w.m.StateFromPeer(103, 7, w.now);
         w.m.StateFromPeer(102, 7, w.now);
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack,
       "rank 1 failed after step 7 again (rank 1 failed there before"},
      {"healthy: another rank fails at the step recovered before (a bug the step done again "
       "meets, alternating ranks): the checkpoint, not another recovery",
       [](Walk& w) {
         w.Begin();
         for (pid_t p : {100, 103, 102}) w.m.StateFromPeer(p, 7, w.now);
         w.members[0].alive = false;
         w.exits = {w.Exit(0, 1)};
         return w.m.Failed(w.members, w.exits, w.current, false, [&w](int) { return w.last_step; });
       },
       Kind::kFallBack, Phase::kFallingBack,
       "rank 0 failed after step 7 again (rank 1 failed there before"},
      {"healthy: a program without step records (the last step unknown) is recovered again: "
       "an unknown step is not the same step",
       [](Walk& w) {
         w.last_step = -1;
         w.Begin();
         for (pid_t p : {100, 103, 102}) w.m.StateFromPeer(p, 7, w.now);
         return w.Fail();
       },
       Kind::kRecover, Phase::kHealthy, ""},
      {"healthy: the same rank at a later step is recovered again",
       [](Walk& w) {
         w.Begin();
         for (pid_t p : {100, 103, 102}) w.m.StateFromPeer(p, 7, w.now);
         w.last_step = 9;
         return w.Fail();
       },
       Kind::kRecover, Phase::kHealthy, "",
       [](const Walk&, const Decision& d) { EXPECT_EQ(d.generation, 2); }},
      {"recover: no free port",
       [](Walk& w) {
         w.Fail();
         return w.m.Abandon("no free port for the new group on 10.0.0.1");
       },
       Kind::kFallBack, Phase::kFallingBack, "no free port"},
      {"recover: a replacement that cannot start (one node)",
       [](Walk& w) { return w.m.Began(false, w.Fail(), {}, 7); }, Kind::kFallBack,
       Phase::kFallingBack},
      {"recover: generation 1 begun, every rank to say it holds the state",
       [](Walk& w) { return w.Begin(); }, Kind::kNone, Phase::kAwaitingState, "",
       [](const Walk& w, const Decision&) {
         EXPECT_EQ(w.m.generation(), 1);
         EXPECT_EQ(w.m.deadline(), w.now + milliseconds(5000));
         EXPECT_EQ(w.m.recovering_from(), "rank 1: exit code 1");
       }},
      // Awaiting the state.
      {"awaiting: some ranks hold the state", [](Walk& w) {
         w.Begin();
         w.m.StateFromPeer(100, 7, w.now);
         return w.m.StateFromPeer(103, 7, w.now);
       },
       Kind::kNone, Phase::kAwaitingState},
      {"awaiting: every rank holds the state",
       [](Walk& w) {
         w.Begin();
         w.Advance(milliseconds(300));
         w.m.StateFromPeer(100, 7, w.now);
         w.m.StateFromPeer(102, 7, w.now);
         w.m.StateFromPeer(102, 7, w.now);  // a second record of one rank changes nothing
         w.Advance(milliseconds(20));
         return w.m.StateFromPeer(103, 7, w.now);
       },
       Kind::kDone, Phase::kHealthy, "",
       [](const Walk& w, const Decision& d) {
         EXPECT_EQ(d.step, 7);
         EXPECT_EQ(d.generation, 1);
         EXPECT_DOUBLE_EQ(d.seconds, 0.32);
         EXPECT_FALSE(w.m.deadline());
         EXPECT_EQ(w.m.recovering_from(), "");
       }},
      {"awaiting: the deadline passes",
       [](Walk& w) {
         w.Begin();
         w.m.StateFromPeer(100, 7, w.now);
         w.m.StateFromPeer(102, 7, w.now);
         w.Advance(milliseconds(4999));
         EXPECT_EQ(w.m.Tick(w.now, w.exits).kind, Kind::kNone);
         w.Advance(milliseconds(1));
         return w.m.Tick(w.now, w.exits);
       },
       Kind::kUnrecovered, Phase::kFallingBack,
       "(generation 1) did not end within 5000 ms: 1 rank(s) never said they hold the state"},
      {"awaiting: a rank finishes its work",
       [](Walk& w) {
         w.Begin();
         w.exits.push_back(w.Exit(0, 0));
         return w.m.Tick(w.now, w.exits);
       },
       Kind::kUnrecovered, Phase::kFallingBack,
       "rank 0 finished its work during the in-process recovery"},
      {"awaiting: another failure (the digests differ: the ranks throw)",
       [](Walk& w) {
         w.Begin();
         return w.Fail();
       },
       Kind::kFallBack, Phase::kFallingBack, "another rank failed during the in-process recovery",
       [](const Walk& w, const Decision&) {
         // The restart's cause is the fault the recovery began with.
         EXPECT_EQ(w.m.recovering_from(), "rank 1: exit code 1");
       }},
      {"healthy: the time passes", [](Walk& w) {
         w.Advance(milliseconds(60000));
         return w.m.Tick(w.now, w.exits);
       },
       Kind::kNone, Phase::kHealthy},
      // Across nodes: this node's loss.
      {"across: the node of global rank 0 picks the port with its ask",
       [](Walk& w) {
         w = Walk::AcrossNodes(/*rank0=*/true);
         return w.Fail();
       },
       Kind::kRecover, Phase::kHealthy, "",
       [](const Walk&, const Decision& d) { EXPECT_TRUE(d.needs_port); }},
      {"across: a node whose every rank failed (one rank a node) asks the job: the survivors are "
       "on the other nodes",
       [](Walk& w) {
         w = Walk::AcrossNodes(/*rank0=*/false);
         w.exits = {w.Exit(0, 1), w.Exit(2, 1)};
         return w.Fail();
       },
       Kind::kRecover, Phase::kHealthy, "",
       [](const Walk&, const Decision& d) { EXPECT_EQ(d.lost.size(), 3u); }},
      {"across: another node asks without a port",
       [](Walk& w) {
         w = Walk::AcrossNodes(/*rank0=*/false);
         return w.Fail();
       },
       Kind::kRecover, Phase::kHealthy, "",
       [](const Walk&, const Decision& d) { EXPECT_FALSE(d.needs_port); }},
      {"across: the job takes the ask",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         return w.Ask();
       },
       Kind::kNone, Phase::kAsked, "",
       [](const Walk& w, const Decision&) {
         EXPECT_EQ(w.m.deadline(), w.now + milliseconds(5000));
       }},
      {"across: the job refuses the ask",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         return w.Ask(absl::FailedPreconditionError("another regroup is under way"));
       },
       Kind::kFallBack, Phase::kFallingBack,
       "the job did not regroup: another regroup is under way"},
      {"asked: a notice without the port yet",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.Ask();
         return w.Notify(Regroup(1, 0));
       },
       Kind::kNone, Phase::kAsked},
      {"asked: the notice with the port begins the generation",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.Ask();
         const SteadyTime asked = w.now;
         w.Advance(milliseconds(40));
         Decision d = w.Notify(Regroup(1, 45001, "node-b"));
         EXPECT_EQ(d.fault, asked);  // the recovery's span starts at this node's fault
         return d;
       },
       Kind::kBegin, Phase::kAsked, "",
       [](const Walk&, const Decision& d) {
         EXPECT_FALSE(d.elsewhere);
         EXPECT_EQ(d.next.master_port, 45001);
         ASSERT_EQ(d.lost.size(), 1u);
         EXPECT_EQ(d.said, std::vector<std::string>{"rank 5: exit code 1"});
       }},
      {"asked: the port never comes",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.Ask();
         w.Advance(milliseconds(5000));
         return w.m.Tick(w.now, w.exits);
       },
       Kind::kUnrecovered, Phase::kFallingBack,
       "generation 1 asked of the job did not begin within 5000 ms (its master port never came)"},
      {"asked: another failure meanwhile",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.Ask();
         return w.m.Failed(w.members, {w.Exit(0, 1)}, w.current, false,
                           [](int) { return 7; });
       },
       Kind::kFallBack, Phase::kFallingBack, "another rank failed during the in-process recovery"},
      // Across nodes: another node's loss, a node lost, a node admitted.
      {"across: another node's loss with its port regroups every rank here",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         return w.Notify(Regroup(1, 45001));
       },
       Kind::kBegin, Phase::kHealthy, "",
       [](const Walk& w, const Decision& d) {
         EXPECT_TRUE(d.elsewhere);
         EXPECT_FALSE(d.admission);
         EXPECT_TRUE(d.lost.empty());
         EXPECT_EQ(d.fault, w.now);
         EXPECT_EQ(d.said, std::vector<std::string>{"rank 1 lost (on node node-a)"});
       }},
      {"across: an old generation's notice", [](Walk& w) {
         w = Walk::AcrossNodes(false);
         return w.Notify(Regroup(0, 45001));
       },
       Kind::kNone, Phase::kHealthy},
      {"across: the node of global rank 0 posts the port, once",
       [](Walk& w) {
         w = Walk::AcrossNodes(true);
         EXPECT_EQ(w.Notify(Regroup(1, 0)).kind, Kind::kPostPort);
         return w.Notify(Regroup(1, 0));
       },
       Kind::kNone, Phase::kHealthy},
      {"across: a port that cannot be posted",
       [](Walk& w) {
         w = Walk::AcrossNodes(true);
         w.Notify(Regroup(1, 0));
         return w.m.Posted(absl::UnavailableError("no free port on 10.0.0.1"), 1);
       },
       Kind::kUnrecovered, Phase::kFallingBack,
       "cannot post the port of generation 1: no free port on 10.0.0.1"},
      {"across: a regroup that reaches a rank here that did not declare it",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.members[0].recoverable = false;
         return w.Notify(Regroup(1, 45001));
       },
       Kind::kUnrecovered, Phase::kFallingBack,
       "rank 1 lost (on node node-a): local rank 0 did not declare in-process recovery"},
      {"across: a regroup that reaches a rank here that is gone",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.members[2].alive = false;
         return w.Notify(Regroup(1, 45001));
       },
       Kind::kUnrecovered, Phase::kFallingBack, "local rank 2 is gone"},
      {"across: the job goes on without this node",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         Notice n = Regroup(1, 45001);
         n.reason = "node node-b lost";
         n.places = {{"node-a", 0, 0}};
         n.world_size = 4;
         return w.Notify(n);
       },
       Kind::kUnrecovered, Phase::kFallingBack,
       "generation 1 goes on without this node (node node-b lost)"},
      {"across: a node lost elsewhere gives this node its new place",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.current.rank_offset = 8;
         w.current.world_size = 12;
         Notice n = Regroup(1, 45001);
         n.reason = "node node-x lost";
         n.places = {{"node-a", 0, 0}, {"node-b", 1, 4}};
         n.world_size = 8;
         n.master_addr = "10.0.0.1";
         return w.Notify(n);
       },
       Kind::kBegin, Phase::kHealthy, "",
       [](const Walk&, const Decision& d) {
         EXPECT_FALSE(d.admission);
         EXPECT_EQ(d.next.node_rank, 1);
         EXPECT_EQ(d.next.rank_offset, 4);
         EXPECT_EQ(d.next.num_nodes, 2);
         EXPECT_EQ(d.next.world_size, 8);
         EXPECT_EQ(d.next.master_addr, "10.0.0.1");
         EXPECT_EQ(d.said, std::vector<std::string>{
                               "node node-x lost; the job goes on with 8 rank(s) on 2 node(s)"});
       }},
      {"across: a node admitted elsewhere grows the group",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         Notice n = Regroup(1, 45001);
         n.places = {{"node-a", 0, 0}, {"node-b", 1, 4}, {"node-c", 2, 8}};
         n.world_size = 12;
         return w.Notify(n);
       },
       Kind::kBegin, Phase::kHealthy, "",
       [](const Walk&, const Decision& d) { EXPECT_TRUE(d.admission); }},
      {"across: a generation that cannot start here",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         return w.m.Began(false, w.Notify(Regroup(1, 45001)), {}, -1);
       },
       Kind::kUnrecovered, Phase::kFallingBack, "generation 1 could not start here"},
      // Falling back, and the next group.
      {"falling back: notices are not followed",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.Ask(absl::UnavailableError("unreachable"));
         return w.Notify(Regroup(1, 45001));
       },
       Kind::kNone, Phase::kFallingBack},
      {"falling back: the restarted group is healthy at generation 0",
       [](Walk& w) {
         w.Begin();
         w.Fail();
         w.m.GroupStarted(0, {200, 201, 202}, w.now);
         return w.m.Tick(w.now + milliseconds(60000), {});
       },
       Kind::kNone, Phase::kHealthy, "",
       [](const Walk& w, const Decision&) { EXPECT_EQ(w.m.generation(), 0); }},
      {"a new round: the node of global rank 0 posts generation 1's port again",
       [](Walk& w) {
         w = Walk::AcrossNodes(true);
         w.Notify(Regroup(1, 0));
         w.m.Posted(absl::UnavailableError("unreachable"), 1);
         w.m.GroupStarted(0, {200, 201, 202}, w.now);
         return w.Notify(Regroup(1, 0));
       },
       Kind::kPostPort, Phase::kHealthy},
      {"admitted: a node admitted into a running group awaits every rank's state",
       [](Walk& w) {
         w = Walk::AcrossNodes(false);
         w.m.GroupStarted(3, {200, 201, 202}, w.now);
         w.m.StateFromPeer(200, 7, w.now);
         w.m.StateFromPeer(201, 7, w.now);
         return w.m.Tick(w.now + milliseconds(5000), {});
       },
       Kind::kUnrecovered, Phase::kFallingBack,
       "(generation 3) did not end within 5000 ms: 1 rank(s) never said"},
  };
}

TEST(RecoveryMachine, EveryRowOfTheTransitionTable) {
  int rows = 0;
  for (const Row& row : Rows()) {
    SCOPED_TRACE(row.name);
    Walk w;
    w.m.GroupStarted(0, {100, 101, 102}, w.now);
    const Decision d = row.run(w);
    EXPECT_EQ(static_cast<int>(d.kind), static_cast<int>(row.kind));
    EXPECT_EQ(PhaseName(w.m.phase()), std::string(PhaseName(row.after)));
    EXPECT_NE(d.why.find(row.why), std::string::npos) << d.why;
    if (row.why[0] == '\0' && row.kind != Kind::kUnrecovered) {
      EXPECT_EQ(d.why, "") << "a silent row said something";
    }
    if (row.also) row.also(w, d);
    ++rows;
  }
  EXPECT_EQ(rows, 45);
}

}  // namespace
}  // namespace dlrun::launcher::recovery_machine_test
