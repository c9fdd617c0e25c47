// A node lost from a running round (docs/RECOVERY.md, "A node lost"): when every survivor's
// workers recover in process, the round goes on without it (a Resize for the regroup) instead of
// a new round; a member whose regroup watch ended is lost after the watch grace, not the
// liveness limit. Fake clock, no threads.
#include <optional>

#include "gtest/gtest.h"
#include "rendezvous/state_machine.h"
#include "tests/rdzv/state_machine_fixture.h"

namespace dlrun::rdzv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class NodeLoss : public testing::StateMachineTest {
 protected:
  // Three nodes of 2, 3 and 2 ranks, every one recovering in process.
  void StartThree(int min_nodes = 1) {
    Make({.min_nodes = min_nodes,
          .max_nodes = 3,
          .heartbeat_interval = seconds(1),
          .heartbeat_misses = 5,
          .max_restarts = 3});
    Join("a", 2);
    Join("b", 3);
    Join("c", 2);
    ASSERT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
    HeartbeatAll({"a", "b", "c"}, /*in_process=*/true);
  }
};

TEST_F(NodeLoss, SurvivorsThatRecoverInProcessGoOnInTheSameRoundWithTheirNewPlaces) {
  StartThree();
  for (int i = 0; i < 6; ++i) {
    Advance(seconds(1));
    HeartbeatAll({"a", "c"}, true);  // b is silent
  }
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kRunning);
  EXPECT_EQ(sm_->state().round, 1u);
  EXPECT_EQ(sm_->state().restart_count, 0);
  EXPECT_EQ(sm_->members().WorldSize(), 4);
  std::optional<Resize> s = sm_->TakeResize();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->round, 1u);
  ASSERT_EQ(s->places.size(), 2u);
  EXPECT_EQ(s->places[0].node_id, "a");
  EXPECT_EQ(s->places[0].rank_offset, 0);
  EXPECT_EQ(s->places[1].node_id, "c");
  EXPECT_EQ(s->places[1].node_rank, 1);
  EXPECT_EQ(s->places[1].rank_offset, 2);  // was 5, after b's 3 ranks
  EXPECT_EQ(s->world_size, 4);
  EXPECT_EQ(s->master_addr, "addr-a");
  EXPECT_NE(s->reason.find("host-b (b, missed heartbeats)"), std::string::npos) << s->reason;
  EXPECT_FALSE(sm_->TakeResize().has_value());  // taken once
  // The survivors' heartbeats go on as before; the lost node's is told to re-join.
  auto hb = sm_->Heartbeat("a", 1, now_, true);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kContinue);
  hb = sm_->Heartbeat("b", 1, now_, true);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kRestart);
}

TEST_F(NodeLoss, LosingTheFirstNodeMovesTheMasterAddress) {
  StartThree();
  for (int i = 0; i < 6; ++i) {
    Advance(seconds(1));
    HeartbeatAll({"b", "c"}, true);
  }
  std::optional<Resize> s = sm_->TakeResize();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->master_addr, "addr-b");
  EXPECT_EQ(s->places[0].rank_offset, 0);
  EXPECT_EQ(s->places[1].rank_offset, 3);
}

TEST_F(NodeLoss, ASurvivorThatDoesNotRecoverInProcessOpensANewRound) {
  StartThree();
  for (int i = 0; i < 6; ++i) {
    Advance(seconds(1));
    HeartbeatAll({"a"}, true);
    HeartbeatAll({"c"}, false);  // c's workers did not declare it
  }
  EXPECT_EQ(sm_->state().round, 2u);
  EXPECT_EQ(sm_->state().restart_count, 1);
  EXPECT_FALSE(sm_->TakeResize().has_value());
}

TEST_F(NodeLoss, BelowTheMinimumTheJobFailsAsBefore) {
  StartThree(/*min_nodes=*/3);
  for (int i = 0; i < 6; ++i) {
    Advance(seconds(1));
    HeartbeatAll({"a", "c"}, true);
  }
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kFailed);
  EXPECT_FALSE(sm_->TakeResize().has_value());
}

TEST_F(NodeLoss, AnEndedWatchLosesTheNodeAfterTheGraceNotTheLivenessLimit) {
  StartThree();
  sm_->WatchEnded("b", now_);
  ASSERT_TRUE(sm_->NextDeadline().has_value());
  EXPECT_EQ(*sm_->NextDeadline(), now_ + config_.watch_grace);
  Advance(config_.watch_grace - milliseconds(1));
  EXPECT_FALSE(sm_->TakeResize().has_value());
  Advance(milliseconds(1));
  std::optional<Resize> s = sm_->TakeResize();
  ASSERT_TRUE(s.has_value());
  EXPECT_NE(s->reason.find("host-b (b, its connection closed)"), std::string::npos) << s->reason;
  EXPECT_EQ(s->world_size, 4);
}

TEST_F(NodeLoss, ANodeHeardFromAfterItsWatchEndedStays) {
  StartThree();
  sm_->WatchEnded("b", now_);
  Advance(milliseconds(100));
  sm_->Heard("b", now_);  // a new watch
  sm_->WatchEnded("c", now_);
  Advance(milliseconds(100));
  HeartbeatAll({"c"}, true);  // a heartbeat after the watch ended
  Advance(seconds(1));
  EXPECT_FALSE(sm_->TakeResize().has_value());
  EXPECT_EQ(sm_->members().WorldSize(), 7);
}

TEST_F(NodeLoss, AnEndedWatchSaysNothingOfANodeThatDoesNotRecoverInProcessOrHasLeft) {
  StartThree();
  HeartbeatAll({"a"}, false);
  sm_->WatchEnded("a", now_);
  Deliveries out;
  ASSERT_TRUE(sm_->Leave("c", 1, /*success=*/true, now_, &out).ok());
  sm_->WatchEnded("c", now_);
  Advance(seconds(1));
  EXPECT_FALSE(sm_->TakeResize().has_value());
  EXPECT_EQ(sm_->state().round, 1u);
  EXPECT_EQ(sm_->members().WorldSize(), 7);
}

}  // namespace
}  // namespace dlrun::rdzv
