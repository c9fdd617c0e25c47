// The rendezvous state machine under a fake clock: no sleeps, no threads, no sockets.
#include "rendezvous/state_machine.h"

#include <map>

#include "gtest/gtest.h"
#include "tests/rdzv/state_machine_fixture.h"

namespace dlrun::rdzv {
namespace {

using std::chrono::seconds;

using testing::StateMachineTest;

// Suites by behaviour, on one fixture.
using RoundClosing = StateMachineTest;    // when a round closes, or does not
using RankAssignment = StateMachineTest;  // who gets which ranks
using RestartRounds = StateMachineTest;   // failures, scale-up and the end of the job
using NodeLiveness = StateMachineTest;    // silent members

TEST_F(RoundClosing, ClosesAtOnceWhenMaxNodesJoined) {
  Make({.min_nodes = 1, .max_nodes = 3});
  Join("a");
  Join("b");
  EXPECT_TRUE(results_.empty());
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kJoining);
  Join("c");
  ASSERT_EQ(results_.size(), 3u);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
  for (auto& [id, r] : results_) {
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->world_size, 6);
    EXPECT_EQ(r->num_nodes, 3);
    EXPECT_EQ(r->round, 1u);
  }
}

TEST_F(RoundClosing, ClosesAtLastCallOnceMinNodesJoined) {
  Make({.min_nodes = 2, .max_nodes = 4, .last_call = seconds(30)});
  Join("a");
  Advance(seconds(100));  // below min: the last call does not start
  EXPECT_TRUE(results_.empty());
  Join("b");
  Advance(seconds(29));
  EXPECT_TRUE(results_.empty());
  EXPECT_EQ(sm_->NextDeadline(), now_ + seconds(1));
  Join("c");  // arrives during the last call: included
  Advance(seconds(1));
  ASSERT_EQ(results_.size(), 3u);
  EXPECT_EQ(results_["c"]->num_nodes, 3);
}

TEST_F(RoundClosing, JoinTimeoutFailsWithCountsAndExpectedHosts) {
  Make({.min_nodes = 3, .max_nodes = 3, .join_timeout = seconds(600),
        .expected_hosts = {"node1", "node2", "node3"}});
  Join("a");
  Advance(seconds(599));
  EXPECT_TRUE(results_.empty());
  Advance(seconds(1));
  ASSERT_EQ(results_.size(), 1u);
  ASSERT_FALSE(results_["a"].ok());
  const std::string msg(results_["a"].status().message());
  EXPECT_NE(msg.find("1 of the minimum 3 nodes joined (host-a)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected node1, node2, node3"), std::string::npos) << msg;
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kFailed);
  Deliveries out;
  EXPECT_FALSE(sm_->Join(Node("late"), 99, now_, [](auto) {}, &out).ok());
}

TEST_F(RankAssignment, RanksAreDeterministicPrefixSumsWithHeterogeneousNproc) {
  Make({.min_nodes = 3, .max_nodes = 3});
  Join("c", 1);
  Join("a", 4);
  Join("b", 2);
  EXPECT_EQ(results_["a"]->node_rank, 0);
  EXPECT_EQ(results_["a"]->rank_offset, 0);
  EXPECT_EQ(results_["b"]->node_rank, 1);
  EXPECT_EQ(results_["b"]->rank_offset, 4);
  EXPECT_EQ(results_["c"]->node_rank, 2);
  EXPECT_EQ(results_["c"]->rank_offset, 6);
  for (auto& [id, r] : results_) {
    EXPECT_EQ(r->world_size, 7);
    EXPECT_EQ(r->master_addr, "addr-a");
    EXPECT_EQ(r->master_port, results_["a"]->master_port);
  }
  EXPECT_EQ(results_["a"]->local_world_size, 4);
}

TEST_F(RankAssignment, SlurmNodeIdsDecideRanksWhenAllKnowThem) {
  Make({.min_nodes = 2, .max_nodes = 2});
  Join("a", 2, 1);
  Join("z", 2, 0);
  EXPECT_EQ(results_["z"]->node_rank, 0);
  EXPECT_EQ(results_["a"]->node_rank, 1);
  EXPECT_EQ(results_["a"]->master_addr, "addr-z");
}

// Without a Slurm order the hosting agent is node 0 (the chaos runner and users reading the
// host's log rely on it), and "host:pid" ids order by the pid as a number, not as text.
TEST_F(RankAssignment, HostingAgentIsNodeZeroAndPidsCompareAsNumbers) {
  Make({.min_nodes = 3, .max_nodes = 3, .first_node_id = "n:99999"});
  Join("n:100001");
  Join("n:99999");
  Join("n:100000");
  EXPECT_EQ(results_["n:99999"]->node_rank, 0);
  EXPECT_EQ(results_["n:99999"]->master_addr, "addr-n:99999");
  EXPECT_EQ(results_["n:100000"]->node_rank, 1);
  EXPECT_EQ(results_["n:100001"]->node_rank, 2);
}

TEST_F(RankAssignment, NumericPidsOrderWithoutAHost) {
  Make({.min_nodes = 3, .max_nodes = 3});
  Join("n:1001");
  Join("n:987");
  Join("m:5");
  EXPECT_EQ(results_["m:5"]->node_rank, 0);  // the text before the pid decides first
  EXPECT_EQ(results_["n:987"]->node_rank, 1);
  EXPECT_EQ(results_["n:1001"]->node_rank, 2);
}

TEST_F(RankAssignment, SlurmOrderBeatsTheHostingAgent) {
  Make({.min_nodes = 2, .max_nodes = 2, .first_node_id = "a"});
  Join("a", 2, 1);
  Join("z", 2, 0);
  EXPECT_EQ(results_["z"]->node_rank, 0);
  EXPECT_EQ(results_["a"]->node_rank, 1);
}

TEST_F(RestartRounds, FailureReportOpensNewRoundWithSameRestartCountEverywhere) {
  Make({.min_nodes = 2, .max_nodes = 2, .max_restarts = 2});
  Join("a");
  Join("b");
  ASSERT_EQ(sm_->state().round, 1u);
  auto r = Fail("b", 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->next_round, 2u);
  EXPECT_FALSE(r->restarts_exhausted);
  // The other node learns it at its next heartbeat.
  auto hb = sm_->Heartbeat("a", 1, now_);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kRestart);
  EXPECT_NE(hb->reason.find("worker failure on host-b"), std::string::npos);
  // A second report of the same failure (stale round) changes nothing.
  r = Fail("a", 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->next_round, 2u);
  EXPECT_EQ(sm_->state().restart_count, 1);
  // Both re-join; the round closes as soon as both are back (no last-call wait).
  Join("a");
  Join("b");
  ASSERT_EQ(results_.size(), 2u);
  EXPECT_EQ(results_["a"]->restart_count, 1);
  EXPECT_EQ(results_["b"]->restart_count, 1);
  EXPECT_EQ(results_["a"]->round, 2u);
  // Restarts run out: the job fails and heartbeats say stop.
  ASSERT_TRUE(Fail("a", 2).ok());
  Join("a");
  Join("b");
  r = Fail("a", 3);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->restarts_exhausted);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kFailed);
  hb = sm_->Heartbeat("b", 3, now_);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kStop);
  EXPECT_NE(hb->reason.find("no restarts left"), std::string::npos);
}

// A failure the agent found to repeat the last one is reported fatal: the job fails at once, with
// restarts left, and the other nodes are told to stop, not to restart.
TEST_F(RestartRounds, AFatalFailureStopsTheJobWithRestartsLeft) {
  Make({.min_nodes = 2, .max_nodes = 2, .max_restarts = 5});
  Join("a");
  Join("b");
  Deliveries out;
  auto r = sm_->ReportFailure("b", 1, "rank 3 exited with 1", now_, &out, /*fatal=*/true);
  Run(out);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->restarts_exhausted);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kFailed);
  EXPECT_EQ(sm_->state().restart_count, 0);
  auto hb = sm_->Heartbeat("a", 1, now_);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kStop);
  EXPECT_NE(hb->reason.find("repeats the last failure"), std::string::npos) << hb->reason;
}

// A failure in place of an in-process recovery (a refusal) opens a new round that the workers
// see as a restart, but not one of max_restarts: with none, the job goes on; an ordinary failure
// after it still finds none left.
TEST_F(RestartRounds, AFallbackIsARestartNotCountedAgainstMaxRestarts) {
  Make({.min_nodes = 2, .max_nodes = 2, .max_restarts = 0});
  Join("a");
  Join("b");
  Deliveries out;
  auto r = sm_->ReportFailure("b", 1, "rank 3 refused", now_, &out, /*fatal=*/false,
                              /*fallback=*/true);
  Run(out);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->restarts_exhausted);
  EXPECT_EQ(sm_->state().restart_count, 1);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kJoining);
  Join("a");
  Join("b");
  r = Fail("a", 2);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->restarts_exhausted);
}

// A node dies and its workers' peers report the failure before the liveness limit: the new
// round expects the dead node too. Once it has been silent for the limit it is no longer
// expected, so the survivors' round closes then, not at the 30-s last call. A member that
// heartbeats while it stops its workers is still waited for.
TEST_F(NodeLiveness, AMemberSilentForTheLimitIsNoLongerExpectedByAJoiningRound) {
  Make({.min_nodes = 1, .max_nodes = 3, .last_call = seconds(30), .heartbeat_interval = seconds(1),
        .heartbeat_misses = 5, .max_restarts = 3});
  Join("a");
  Join("b");
  Join("c");
  ASSERT_EQ(results_.size(), 3u);
  ASSERT_TRUE(Fail("a", 1).ok());  // c died at the same moment; a's report comes first
  Join("a");
  for (int i = 0; i < 3; ++i) {
    Advance(std::chrono::milliseconds(1000));
    auto hb = sm_->Heartbeat("b", 1, now_);  // b is alive, still stopping its workers
    ASSERT_TRUE(hb.ok());
    EXPECT_EQ(hb->action, Action::kRestart);
  }
  EXPECT_EQ(results_.count("a"), 0u) << "the round waits for b and c";
  Join("b");
  EXPECT_EQ(results_.count("b"), 0u) << "c is still expected";
  auto deadline = sm_->NextDeadline();
  ASSERT_TRUE(deadline.has_value());
  EXPECT_LE(*deadline - now_, seconds(3)) << "c's limit, not the last call";
  Advance(std::chrono::milliseconds(2100));  // c silent 5.1 s
  ASSERT_EQ(results_.count("a"), 1u);
  ASSERT_TRUE(results_["a"].ok()) << results_["a"].status();
  EXPECT_EQ(results_["a"]->round, 2u);
  EXPECT_EQ(results_["a"]->num_nodes, 2);
  EXPECT_EQ(results_["b"]->num_nodes, 2);
  EXPECT_EQ(results_["c"]->round, 1u);  // c's last assignment
}

TEST_F(RestartRounds, ForgedNodeCannotTriggerARestart) {
  Make({.min_nodes = 2, .max_nodes = 2, .max_restarts = 5});
  Join("a");
  Join("b");
  auto r = Fail("mallory", 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sm_->state().round, 1u);
  EXPECT_EQ(sm_->state().restart_count, 0);
  EXPECT_EQ(sm_->Heartbeat("mallory", 1, now_).status().code(), absl::StatusCode::kNotFound);
  Deliveries out;
  EXPECT_EQ(sm_->Leave("mallory", 1, false, now_, &out).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
}

TEST_F(NodeLiveness, HeartbeatLossWithEnoughSurvivorsStartsNewRound) {
  Make({.min_nodes = 2, .max_nodes = 3, .heartbeat_interval = seconds(5),
        .heartbeat_misses = 3, .max_restarts = 3});
  Join("a");
  Join("b");
  Join("c");
  for (int i = 0; i < 4; ++i) {
    Advance(seconds(5));
    HeartbeatAll({"a", "b"});  // c is silent
  }
  EXPECT_EQ(sm_->state().round, 2u);
  EXPECT_EQ(sm_->state().restart_count, 1);
  auto hb = sm_->Heartbeat("a", 1, now_);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kRestart);
  EXPECT_NE(hb->reason.find("host-c"), std::string::npos);
  Join("a");
  Join("b");  // both survivors back: closes without waiting for c or the last call
  ASSERT_TRUE(results_["b"].ok());
  EXPECT_EQ(results_["b"]->num_nodes, 2);
  EXPECT_EQ(results_["b"]->world_size, 4);
  EXPECT_EQ(results_["b"]->restart_count, 1);
}

TEST_F(NodeLiveness, HeartbeatLossBelowMinFailsTheJob) {
  Make({.min_nodes = 2, .max_nodes = 2, .heartbeat_interval = seconds(1),
        .heartbeat_misses = 2, .max_restarts = 3});
  Join("a");
  Join("b");
  for (int i = 0; i < 3; ++i) {
    Advance(seconds(1));
    HeartbeatAll({"a"});
  }
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kFailed);
  EXPECT_NE(sm_->state().failure_reason.find("below the minimum of 2"), std::string::npos)
      << sm_->state().failure_reason;
  auto hb = sm_->Heartbeat("a", 1, now_);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kStop);
}

TEST_F(RestartRounds, ScaleUpRestartsIntoALargerRoundWithoutUsingARestart) {
  Make({.min_nodes = 2, .max_nodes = 3, .max_restarts = 0});
  Join("a");
  Join("b");
  Advance(config_.last_call);
  ASSERT_EQ(results_.size(), 2u);
  Join("c");  // arrives while the round runs: held, and a new round opens
  EXPECT_FALSE(results_.count("c"));
  auto hb = sm_->Heartbeat("a", 1, now_);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kRestart);
  EXPECT_NE(hb->reason.find("scale-up"), std::string::npos);
  Join("a");
  Join("b");
  ASSERT_TRUE(results_["c"].ok());
  EXPECT_EQ(results_["c"]->num_nodes, 3);
  EXPECT_EQ(results_["c"]->restart_count, 0);
  EXPECT_EQ(sm_->state().restart_count, 0);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
}

TEST_F(RoundClosing, JoinBeyondMaxWaitsForTheNextRound) {
  Make({.min_nodes = 1, .max_nodes = 1, .max_restarts = 1});
  Join("a");
  Join("b");  // full: held
  EXPECT_FALSE(results_.count("b"));
  EXPECT_EQ(sm_->state().round, 1u);
  ASSERT_TRUE(Fail("a", 1).ok());  // the next round takes the waiting node
  EXPECT_TRUE(results_["b"].ok());
  EXPECT_EQ(results_["b"]->round, 2u);
}

TEST_F(RoundClosing, CancelledJoinIsForgotten) {
  Make({.min_nodes = 2, .max_nodes = 2});
  Join("a");
  EXPECT_TRUE(sm_->CancelJoin("a", ticket_));
  EXPECT_FALSE(sm_->CancelJoin("a", ticket_));
  Join("b");
  EXPECT_TRUE(results_.empty());
  EXPECT_EQ(sm_->Snapshot().joined, 1);
}

TEST_F(RestartRounds, AllNodesLeavingSuccessfullyEndsTheJob) {
  Make({.min_nodes = 2, .max_nodes = 2});
  Join("a");
  Join("b");
  Deliveries out;
  ASSERT_TRUE(sm_->Leave("a", 1, true, now_, &out).ok());
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
  ASSERT_TRUE(sm_->Leave("b", 1, true, now_, &out).ok());
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kSucceeded);
}

// The preflight's compute probe travels with each join; the round leaves out a node far under
// its median when it can do without it, else the job fails naming it.
using PreflightRound = StateMachineTest;

TEST_F(PreflightRound, LeavesOutASlowNodeWhenTheRoundCanDoWithoutIt) {
  Make({.min_nodes = 2, .max_nodes = 3});
  for (const auto& [id, gflops] : std::map<std::string, double>{{"a", 10}, {"b", 2}, {"c", 9}}) {
    NodeInfo n = Node(id);
    n.preflight_gflops = gflops;
    Deliveries out;
    ASSERT_TRUE(sm_->Join(n, ++ticket_, now_,
                          [this, id = id](absl::StatusOr<Assignment> a) { results_[id] = a; },
                          &out)
                    .ok());
    Run(out);
  }
  ASSERT_EQ(results_.size(), 3u);
  ASSERT_FALSE(results_.at("b").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(results_.at("b").status()));
  EXPECT_EQ(results_.at("b").status().message(),
            std::string(kLeftOutByPreflight) +
                "node host-b: compute probe 2.00 GFLOP/s, under 50% of the round's median 9.00");
  ASSERT_TRUE(results_.at("a").ok());
  EXPECT_EQ(results_.at("a")->num_nodes, 2);
  EXPECT_EQ(results_.at("c")->world_size, 4);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);

  // A slow node that would scale the running round up is refused at once: no new round.
  const uint64_t round = sm_->state().round;
  NodeInfo late = Node("d");
  late.preflight_gflops = 3;
  Deliveries out;
  ASSERT_TRUE(sm_->Join(late, ++ticket_, now_,
                        [this](absl::StatusOr<Assignment> a) { results_["d"] = a; }, &out)
                  .ok());
  Run(out);
  ASSERT_TRUE(results_.count("d"));
  EXPECT_NE(results_.at("d").status().message().find("node host-d: compute probe 3.00 GFLOP/s"),
            std::string::npos)
      << results_.at("d").status();
  EXPECT_EQ(sm_->state().round, round);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
}

TEST_F(PreflightRound, FailsTheJobWhenTheSlowNodeIsNeededAndKeepsNodesWithoutAFigure) {
  Make({.min_nodes = 2, .max_nodes = 2});
  NodeInfo fast = Node("a"), slow = Node("b");
  fast.preflight_gflops = 8;
  slow.preflight_gflops = 1.5;  // of two, the median is the faster one
  for (const NodeInfo& n : {fast, slow}) {
    Deliveries out;
    ASSERT_TRUE(sm_->Join(n, ++ticket_, now_,
                          [this, id = n.node_id](absl::StatusOr<Assignment> a) {
                            results_[id] = a;
                          },
                          &out)
                    .ok());
    Run(out);
  }
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kFailed);
  EXPECT_EQ(results_.at("b").status().message(),  // the slow node records itself as bad
            std::string(kLeftOutByPreflight) +
                "node host-b: compute probe 1.50 GFLOP/s, under 50% of the round's median 8.00");
  ASSERT_FALSE(results_.at("a").ok());
  EXPECT_NE(results_.at("a").status().message().find(
                "the preflight found a slow node the round cannot do without (--nnodes needs at "
                "least 2): node host-b: compute probe 1.50 GFLOP/s"),
            std::string::npos)
      << results_.at("a").status();

  // A node without a figure (--preflight off) is never judged.
  Make({.min_nodes = 2, .max_nodes = 2});
  results_.clear();
  Join("x");
  NodeInfo only = Node("y");
  only.preflight_gflops = 0.1;
  Deliveries out;
  ASSERT_TRUE(sm_->Join(only, ++ticket_, now_,
                        [this](absl::StatusOr<Assignment> a) { results_["y"] = a; }, &out)
                  .ok());
  Run(out);
  ASSERT_TRUE(results_.at("y").ok()) << results_.at("y").status();
  EXPECT_EQ(results_.at("x")->num_nodes, 2);
}

// Agents on one machine (one host name) share its CPUs: their probes are not compared.
TEST_F(PreflightRound, NodesOnOneHostAreNotCompared) {
  Make({.min_nodes = 2, .max_nodes = 2});
  for (const auto& [id, gflops] : std::map<std::string, double>{{"a", 10}, {"b", 1}}) {
    NodeInfo n = Node(id);
    n.hostname = "one-machine";
    n.preflight_gflops = gflops;
    Deliveries out;
    ASSERT_TRUE(sm_->Join(n, ++ticket_, now_,
                          [this, id = id](absl::StatusOr<Assignment> a) { results_[id] = a; },
                          &out)
                    .ok());
    Run(out);
  }
  ASSERT_TRUE(results_.at("b").ok()) << results_.at("b").status();
  EXPECT_EQ(results_.at("a")->num_nodes, 2);
}

}  // namespace
}  // namespace dlrun::rdzv
