// A node that joins a running round (docs/RECOVERY.md, "A node that joins"): when every member's
// workers recover in process, the node is admitted into the same round (a Resize for the
// regroup, its join answered once the new group's port is posted) instead of a new round in
// which every node restarts from the checkpoint. Fake clock, no threads.
#include <optional>

#include "gtest/gtest.h"
#include "rendezvous/state_machine.h"
#include "tests/rdzv/state_machine_fixture.h"

namespace dlrun::rdzv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class NodeAdmit : public testing::StateMachineTest {
 protected:
  // Two nodes of 2 and 3 ranks in round 1 (room for a third), recovering in process or not.
  void StartTwo(bool in_process = true) {
    Make({.min_nodes = 1,
          .max_nodes = 3,
          .last_call = seconds(1),
          .admit_timeout = seconds(3),
          .max_restarts = 3});
    Join("a", 2, -1, true);
    Join("b", 3, -1, true);
    Advance(seconds(1));  // the last call
    ASSERT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
    HeartbeatAll({"a", "b"}, in_process);
  }
  void Admitted(uint64_t round, int generation, int port) {
    Deliveries out;
    sm_->Admitted(round, generation, port, &out);
    Run(out);
  }
};

TEST_F(NodeAdmit, ANodeJoiningMembersThatRecoverInProcessIsAdmittedIntoTheSameRound) {
  StartTwo();
  Join("c", 2, -1, /*in_process=*/true);
  EXPECT_EQ(sm_->state().round, 1u);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
  EXPECT_EQ(sm_->state().restart_count, 0);
  EXPECT_EQ(results_.count("c"), 0u);  // held until the new group's port is posted
  std::optional<Resize> r = sm_->TakeResize();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->admitted, "c");
  ASSERT_EQ(r->places.size(), 3u);
  EXPECT_EQ(r->places[0].node_id, "a");
  EXPECT_EQ(r->places[1].rank_offset, 2);
  EXPECT_EQ(r->places[2].node_id, "c");
  EXPECT_EQ(r->places[2].node_rank, 2);
  EXPECT_EQ(r->places[2].rank_offset, 5);
  EXPECT_EQ(r->world_size, 7);
  EXPECT_EQ(r->master_addr, "addr-a");
  EXPECT_NE(r->reason.find("node host-c (c) joined the running round"), std::string::npos)
      << r->reason;

  Admitted(/*round=*/7, 1, 45000);  // another round's post changes nothing
  EXPECT_EQ(results_.count("c"), 0u);
  Admitted(1, 1, 45000);
  ASSERT_EQ(results_.count("c"), 1u);
  ASSERT_TRUE(results_.at("c").ok()) << results_.at("c").status();
  const Assignment& a = *results_.at("c");
  EXPECT_EQ(a.round, 1u);
  EXPECT_EQ(a.node_rank, 2);
  EXPECT_EQ(a.num_nodes, 3);
  EXPECT_EQ(a.rank_offset, 5);
  EXPECT_EQ(a.world_size, 7);
  EXPECT_EQ(a.local_world_size, 2);
  EXPECT_EQ(a.master_addr, "addr-a");
  EXPECT_EQ(a.master_port, 45000);
  EXPECT_EQ(a.recovery_generation, 1);
  EXPECT_EQ(sm_->members().WorldSize(), 7);
  // A member like the others now: its heartbeats go on in round 1.
  auto hb = sm_->Heartbeat("c", 1, now_, true);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->action, Action::kContinue);
}

TEST_F(NodeAdmit, AMemberThatDoesNotRecoverInProcessMeansANewRoundAsBefore) {
  StartTwo(/*in_process=*/false);
  Join("c", 2, -1, true);
  EXPECT_EQ(sm_->state().round, 2u);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kJoining);
  EXPECT_FALSE(sm_->TakeResize().has_value());
}

TEST_F(NodeAdmit, AJoiningNodeThatRestartsInsteadMeansANewRound) {
  StartTwo();
  Join("c", 2, -1, /*in_process=*/false);  // its agent runs with --recovery restart
  EXPECT_EQ(sm_->state().round, 2u);
  EXPECT_FALSE(sm_->TakeResize().has_value());
}

TEST_F(NodeAdmit, APortThatNeverComesAdmitsTheNodeThroughANewRound) {
  StartTwo();
  Join("c", 2, -1, true);
  ASSERT_TRUE(sm_->TakeResize().has_value());
  ASSERT_TRUE(sm_->NextDeadline().has_value());
  EXPECT_LE(*sm_->NextDeadline(), now_ + config_.admit_timeout);
  // Silent meanwhile (its agent waits in the join), the node is not lost for it.
  ASSERT_EQ(config_.admit_timeout, seconds(3));
  for (int i = 0; i < 2; ++i) {
    Advance(seconds(1));
    HeartbeatAll({"a", "b"}, true);
  }
  Advance(milliseconds(999));
  EXPECT_EQ(sm_->state().round, 1u);
  Advance(milliseconds(1));
  EXPECT_EQ(sm_->state().round, 2u);
  EXPECT_EQ(sm_->state().restart_count, 0);  // a scale-up, not a failure
  // The members and the node join the new round, which closes as soon as all three are in.
  Join("a", 2, -1, true);
  Join("b", 3, -1, true);
  ASSERT_EQ(results_.count("c"), 1u);
  ASSERT_TRUE(results_.at("c").ok()) << results_.at("c").status();
  EXPECT_EQ(results_.at("c")->round, 2u);
  EXPECT_EQ(results_.at("c")->recovery_generation, 0);
  EXPECT_EQ(sm_->members().WorldSize(), 7);
  Admitted(1, 1, 45000);  // too late: nothing changes
  EXPECT_EQ(sm_->state().round, 2u);
}

TEST_F(NodeAdmit, ANodeThatGoesAwayWhileAdmittedLeavesANewRoundWithoutIt) {
  StartTwo();
  Join("c", 2, -1, true);
  EXPECT_TRUE(sm_->CancelJoin("c", ticket_));
  EXPECT_FALSE(sm_->CancelJoin("c", ticket_));  // once
  Advance(milliseconds(1));
  EXPECT_EQ(sm_->state().round, 2u);
  Join("a", 2, -1, true);
  Join("b", 3, -1, true);
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
  EXPECT_EQ(sm_->members().WorldSize(), 5);
  EXPECT_EQ(results_.count("c"), 0u);
}

TEST_F(NodeAdmit, AFailureWhileANodeIsAdmittedTakesItIntoTheNewRound) {
  StartTwo();
  Join("c", 2, -1, true);
  ASSERT_TRUE(Fail("b", 1).ok());
  EXPECT_EQ(sm_->state().round, 2u);
  EXPECT_EQ(sm_->state().restart_count, 1);
  Join("a", 2, -1, true);
  Join("b", 3, -1, true);
  ASSERT_EQ(results_.count("c"), 1u);
  ASSERT_TRUE(results_.at("c").ok()) << results_.at("c").status();
  EXPECT_EQ(results_.at("c")->round, 2u);
  EXPECT_EQ(sm_->members().WorldSize(), 7);
}

TEST_F(NodeAdmit, AFullRoundHoldsTheJoinAsBefore) {
  StartTwo();
  Join("c", 2, -1, true);
  ASSERT_TRUE(sm_->TakeResize().has_value());
  Admitted(1, 1, 45000);
  HeartbeatAll({"c"}, true);
  Join("d", 2, -1, true);  // max_nodes 3: waits for a round that opens for another reason
  EXPECT_EQ(sm_->state().round, 1u);
  EXPECT_FALSE(sm_->TakeResize().has_value());
  EXPECT_EQ(sm_->Snapshot().waiting, 1);
}

}  // namespace
}  // namespace dlrun::rdzv
