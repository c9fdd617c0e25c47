// The restart ledger (restart_ledger.h): each restart's phases from the agent's marks and the
// workers' records, on made-up times.
#include "launcher/workers/restart_ledger.h"

#include <gtest/gtest.h>

namespace dlrun::launcher {
namespace {

using std::chrono::milliseconds;

struct Timeline {
  SteadyTime t0{};
  SteadyTime at(double s) const {
    return t0 + std::chrono::duration_cast<SteadyTime::duration>(std::chrono::duration<double>(s));
  }
};

// Two local ranks step every 0.1 s from t=0; steps 1..8 done, a fault at 0.85.
void EightSteps(RestartLedger& l, const Timeline& tl) {
  l.GroupStarted(0, tl.at(0), tl.at(0));
  for (int s = 1; s <= 8; ++s) {
    l.Step(s, 0.1, tl.at(0.1 * s));
    l.Step(s, 0.1, tl.at(0.1 * s + 0.001));  // the other rank, a moment later
  }
}

// EightSteps, then a fault at 0.85 and an in-process group (generation 1) running from 0.87.
void EightStepsThenInProcess(RestartLedger& l, const Timeline& tl) {
  EightSteps(l, tl);
  l.FaultSeen(tl.at(0.85));
  l.Stopped(tl.at(0.86));
  l.GroupStarted(0, tl.at(0.86), tl.at(0.87), /*generation=*/1);
}

TEST(RestartLedger, PhasesAreConsecutiveAndSumToLastStepEndToFirstNewStepBegin) {
  RestartLedger l;
  Timeline tl;
  EightSteps(l, tl);
  EXPECT_NEAR(l.productive_s(), 0.8, 1e-9) << "each step once, not once per rank";
  l.FaultSeen(tl.at(0.85));
  l.Stopped(tl.at(1.0));
  l.GroupStarted(1, tl.at(1.2), tl.at(1.25));
  l.Resumed(4, 0.2);  // both ranks load the step-4 checkpoint; the slower one counts
  l.Resumed(4, 0.3);
  // The new group's first step (5) begins at 2.0; steps 5-8 are recomputed; 9 begins at 2.4.
  for (int s = 5; s <= 9; ++s) {
    l.Step(s, 0.1, tl.at(2.0 + 0.1 * (s - 4)));
    l.Step(s, 0.1, tl.at(2.0 + 0.1 * (s - 4) + 0.001));
  }
  const auto costs = l.Costs();
  ASSERT_EQ(costs.size(), 1u);
  const telemetry::RestartCost& c = costs[0];
  EXPECT_EQ(c.restart, 1);
  EXPECT_EQ(c.restarts, 1);
  EXPECT_TRUE(c.resumed);
  EXPECT_NEAR(c.detection_s, 0.049, 1e-6) << "from the last step's end (0.801)";
  EXPECT_NEAR(c.stop_s, 0.15, 1e-6);
  EXPECT_NEAR(c.rendezvous_s, 0.2, 1e-6);
  EXPECT_NEAR(c.start_s, 0.5, 1e-6) << "1.2 -> 2.0, less the 0.3 s load";
  EXPECT_NEAR(c.checkpoint_load_s, 0.3, 1e-6);
  EXPECT_NEAR(c.recomputed_s, 0.4, 1e-6);
  EXPECT_EQ(c.recomputed_steps, 4);
  EXPECT_EQ(c.fault_step, 8);
  EXPECT_EQ(c.resumed_step, 4);
  EXPECT_NEAR(c.total_s(), 2.4 - 0.801, 1e-6);
  EXPECT_NEAR(l.lost_s(), c.total_s(), 1e-9);
  EXPECT_NEAR(l.productive_s(), 0.9, 1e-9) << "step 9 is new; 5-8 again are not";
}

TEST(RestartLedger, ACheckpointAtTheFaultsStepRecomputesNothing) {
  RestartLedger l;
  Timeline tl;
  EightSteps(l, tl);
  l.FaultSeen(tl.at(0.9));
  l.Stopped(tl.at(0.9));
  l.GroupStarted(1, tl.at(1.0), tl.at(1.0));
  l.Resumed(8, 0.1);
  l.Step(9, 0.1, tl.at(1.6));
  const auto c = l.Costs().at(0);
  EXPECT_EQ(c.recomputed_steps, 0);
  EXPECT_NEAR(c.recomputed_s, 0, 1e-9);
  EXPECT_NEAR(c.start_s, 0.4, 1e-6);
  EXPECT_NEAR(c.total_s(), 1.5 - 0.801, 1e-6);
}

// Two restarts, then a third fault that ends the job: the span counts the two restarts (the
// report said "over 3 restarts").
TEST(RestartLedger, AFaultThatEndsTheJobIsNotCountedAsARestart) {
  RestartLedger l;
  Timeline tl;
  EightSteps(l, tl);
  l.FaultSeen(tl.at(1.0));
  l.GroupStarted(1, tl.at(1.2), tl.at(1.2));
  l.FaultSeen(tl.at(1.5));
  l.GroupStarted(2, tl.at(1.7), tl.at(1.7));
  l.FaultSeen(tl.at(2.0));
  l.Stopped(tl.at(2.1));  // and no group follows: the job failed
  const auto costs = l.Costs();
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_EQ(costs[0].restarts, 2);
  EXPECT_EQ(costs[0].restart, 2);
}

TEST(RestartLedger, AFaultDuringTheRecoveryExtendsTheSameSpan) {
  RestartLedger l;
  Timeline tl;
  EightSteps(l, tl);
  l.FaultSeen(tl.at(1.0));
  l.Stopped(tl.at(1.1));
  l.GroupStarted(1, tl.at(1.2), tl.at(1.2));
  l.Step(5, 0.1, tl.at(2.1));  // recomputing, then it fails again
  l.FaultSeen(tl.at(2.5));
  l.Stopped(tl.at(2.6));
  l.GroupStarted(2, tl.at(2.7), tl.at(2.7));
  l.Step(9, 0.1, tl.at(3.8));  // resumed from a checkpoint at 8 this time
  const auto costs = l.Costs();
  ASSERT_EQ(costs.size(), 1u);
  const telemetry::RestartCost& c = costs[0];
  EXPECT_EQ(c.restarts, 2);
  EXPECT_EQ(c.restart, 2);
  EXPECT_EQ(c.recomputed_steps, 1);
  EXPECT_NEAR(c.recomputed_s, 0.5, 1e-6) << "2.0 (step 5 began) -> 2.5 (the second fault)";
  EXPECT_NEAR(c.stop_s, 0.2, 1e-6);
  EXPECT_NEAR(c.rendezvous_s, 0.2, 1e-6);
  EXPECT_NEAR(c.start_s, 0.8 + 1.0, 1e-6);
  EXPECT_NEAR(c.total_s(), 3.7 - 0.801, 1e-6) << "one outage, end to end";
}

// In process: no stop, no rendezvous; the span carries its generation, and a node admitted into
// the running group is labelled as such unless a fault came during it.
TEST(RestartLedger, AnAdmissionIsLabelledWithItsGenerationAndAFaultInItIsAFault) {
  for (const bool fault_meanwhile : {false, true}) {
    RestartLedger l;
    Timeline tl;
    EightSteps(l, tl);
    l.FaultSeen(tl.at(0.85), /*admission=*/true);
    if (fault_meanwhile) l.FaultSeen(tl.at(0.9));
    l.Stopped(tl.at(0.95));
    l.GroupStarted(0, tl.at(0.95), tl.at(0.95), /*generation=*/3);
    l.StartedAs(1, 0, 0);      // the replacement, forked
    l.StateFromPeer(8, 0.55);  // a survivor: the transfer and its wait for the replacement
    l.StateFromPeer(8, 0.5);   // the replacement: the transfer alone
    l.Step(9, 0.1, tl.at(1.6));
    const auto costs = l.Costs();
    ASSERT_EQ(costs.size(), 1u);
    EXPECT_EQ(costs[0].admission, !fault_meanwhile);
    EXPECT_TRUE(costs[0].in_process);
    EXPECT_EQ(costs[0].generation, 3);
    EXPECT_NEAR(costs[0].state_from_peer_s, 0.5, 1e-6);
    EXPECT_EQ(costs[0].started_forked, 1);
    EXPECT_EQ(costs[0].started_cold, 0);
  }
}

TEST(RestartLedger, WithoutStepRecordsTheStartRunsToTheWorkersStart) {
  RestartLedger l;
  Timeline tl;
  l.GroupStarted(0, tl.at(0), tl.at(0));
  l.FaultSeen(tl.at(5));
  l.Stopped(tl.at(5.1));
  l.GroupStarted(1, tl.at(5.3), tl.at(5.35));
  const auto c = l.Costs().at(0);
  EXPECT_FALSE(c.resumed);
  EXPECT_EQ(c.fault_step, -1);
  EXPECT_NEAR(c.detection_s, 0, 1e-9) << "no step: nothing to date the fault by but itself";
  EXPECT_NEAR(c.total_s(), 0.35, 1e-6);
  EXPECT_EQ(l.productive_s(), 0);
}

// A program that reports no steps: the in-process recovery's span cannot end at a later step,
// so it ends when every rank holds the state (it stayed "after step -1: 0.00 s (so far)").
TEST(RestartLedger, AnInProcessRecoveryWithoutStepRecordsRunsToItsEnd) {
  RestartLedger l;
  Timeline tl;
  l.GroupStarted(0, tl.at(0), tl.at(0));
  l.FaultSeen(tl.at(5));
  l.Stopped(tl.at(5.05));
  l.GroupStarted(0, tl.at(5.05), tl.at(5.1), /*generation=*/1);
  l.StateFromPeer(-1, 0.4);
  l.RecoveryDone(tl.at(6.95));
  const auto costs = l.Costs();
  ASSERT_EQ(costs.size(), 1u);
  const auto& c = costs[0];
  EXPECT_TRUE(c.resumed);
  EXPECT_TRUE(c.in_process);
  EXPECT_EQ(c.fault_step, -1);
  EXPECT_NEAR(c.total_s(), 1.95, 1e-6);
  EXPECT_NEAR(c.state_from_peer_s, 0.4, 1e-6);
  EXPECT_NEAR(l.lost_s(), 1.95, 1e-6);
  // With step records, the first step past the fault ends the span, not the recovery's end.
  RestartLedger k;
  EightSteps(k, tl);
  k.FaultSeen(tl.at(0.85));
  k.Stopped(tl.at(0.9));
  k.GroupStarted(0, tl.at(0.9), tl.at(0.9), 1);
  k.RecoveryDone(tl.at(1.0));
  ASSERT_EQ(k.Costs().size(), 1u);
  EXPECT_FALSE(k.Costs()[0].resumed) << "a later step, not the recovery's end, closes it";
}

// A fault, an in-process recovery that a second fault ends, then the restart: one restart
// after an in-process recovery that did not finish (the report said "over 2 restarts").
TEST(RestartLedger, AnInProcessRecoveryThatFailedIsToldApartFromTheRestart) {
  RestartLedger l;
  Timeline tl;
  EightStepsThenInProcess(l, tl);
  l.FaultSeen(tl.at(1.5));  // the survivor refused
  l.Stopped(tl.at(1.6));
  l.GroupStarted(1, tl.at(1.7), tl.at(1.8));
  l.Resumed(4, 0.1);
  for (int s = 5; s <= 9; ++s) l.Step(s, 0.1, tl.at(1.8 + 0.1 * (s - 4)));
  auto costs = l.Costs();
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_EQ(costs[0].restarts, 2);
  EXPECT_EQ(costs[0].in_process_tries, 1);
  EXPECT_EQ(costs[0].restart, 1);
  // One that finished is no try left over.
  RestartLedger k;
  EightStepsThenInProcess(k, tl);
  k.StateFromPeer(8, 0.2);
  k.Step(9, 0.1, tl.at(1.3));
  ASSERT_EQ(k.Costs().size(), 1u);
  EXPECT_EQ(k.Costs()[0].in_process_tries, 0);
}

// The replacement took the state of step 8 and failed before step 9 passed ("failed after step
// 8 again"): the restart that followed is the span's group, so the span is a restart's, after
// one in-process recovery, not an in-process recovery "over 2 in-process recoveries" with the
// restart's start-up inside it and the restart's own line left without figures.
TEST(RestartLedger, ARestartAfterTheReplacementTookTheStateIsTheSpansRestart) {
  RestartLedger l;
  Timeline tl;
  EightStepsThenInProcess(l, tl);
  l.StateFromPeer(8, 0.05);
  l.FaultSeen(tl.at(1.0));  // the replacement, in step 9
  l.Stopped(tl.at(1.05));
  l.GroupStarted(1, tl.at(1.1), tl.at(1.2));
  l.StartedAs(2, 0, 0);
  l.Resumed(4, 0.1);
  for (int s = 5; s <= 9; ++s) l.Step(s, 0.1, tl.at(1.5 + 0.1 * (s - 4)));
  auto costs = l.Costs();
  ASSERT_EQ(costs.size(), 1u);
  const telemetry::RestartCost& c = costs[0];
  EXPECT_FALSE(c.in_process) << "its last group was a restart";
  EXPECT_EQ(c.restart, 1);
  EXPECT_EQ(c.generation, 0);
  EXPECT_EQ(c.recoveries(), 1);
  EXPECT_EQ(c.group_restarts(), 1);
  EXPECT_EQ(c.resumed_step, 4) << "the checkpoint's step, not the peer's";
  EXPECT_TRUE(c.resumed);
  EXPECT_NEAR(c.state_from_peer_s, 0.05, 1e-6) << "the in-process group's transfer stays counted";
  EXPECT_NEAR(c.total_s(), 1.9 - 0.801, 1e-6) << "from step 8's end to step 9's begin";
}

TEST(RestartLedger, AFaultThatEndsTheJobIsNoRestart) {
  RestartLedger l;
  Timeline tl;
  EightSteps(l, tl);
  l.FaultSeen(tl.at(1));
  l.Stopped(tl.at(1.2));
  EXPECT_TRUE(l.Costs().empty());
  EXPECT_EQ(l.lost_s(), 0);
}

TEST(RestartLedger, OldRestartsAreFoldedNotDropped) {
  RestartLedger l;
  Timeline tl;
  double t = 0;
  int64_t step = 0;
  l.GroupStarted(0, tl.at(t), tl.at(t));
  const int n = static_cast<int>(telemetry::kMaxRestartCosts) + 6;
  for (int r = 1; r <= n; ++r) {
    l.Step(++step, 0.1, tl.at(t += 0.1));
    l.FaultSeen(tl.at(t += 0.5));
    t += 0.5;
    l.GroupStarted(r, tl.at(t), tl.at(t));
    l.Step(++step, 0.1, tl.at(t += 0.1));  // 1 s lost each time (0.1 of it in the new step)
  }
  const auto costs = l.Costs();
  EXPECT_EQ(costs.size(), telemetry::kMaxRestartCosts);
  int restarts = 0;
  for (const auto& c : costs) restarts += c.restarts;
  EXPECT_EQ(restarts, n);
  EXPECT_NEAR(l.lost_s(), n * 1.0, 1e-6);
}

}  // namespace
}  // namespace dlrun::launcher
