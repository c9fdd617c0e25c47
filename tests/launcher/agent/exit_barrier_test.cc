// The exit barrier: a worker that finishes early is left alone while the others run, and with a
// rendezvous the agent waits for every node before it exits (a failure elsewhere runs the group
// again).
#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

using Verdict = MembershipSource::Verdict;

TEST(AgentExitBarrier, AnEarlyFinisherDoesNotEndTheOthers) {
  Harness h(3);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(1 + 10 * p.spec.local_rank), 0);  // at 1 s, 11 s, 21 s
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  EXPECT_TRUE(h.procs.sent.empty()) << "a worker was signalled";
  EXPECT_EQ(h.clock.Elapsed(), seconds(21));  // the agent returned when the last one ended
}

TEST(AgentExitBarrier, WithARendezvousTheAgentWaitsUntilEveryNodeIsDone) {
  Harness h(1);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 0, seconds(1));
  ScriptedSource* s = src.get();
  s->after_success = Verdict::kContinue;  // the other node is still training...
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, milliseconds(2500), 0);
    f.SignalAfter(seconds(60), SIGTERM);  // ...until someone stops the job
  };
  EXPECT_EQ(h.Run(std::move(src)), 128 + SIGTERM);
  EXPECT_EQ(s->successes, 1);
  EXPECT_GE(s->checks, 55);  // it kept asking the rendezvous, once a second, for a minute
  EXPECT_EQ(h.clock.Elapsed(), seconds(60));
}

TEST(AgentExitBarrier, AFailureOnAnotherNodeAfterSuccessRunsTheGroupAgain) {
  Harness h(1);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 0, seconds(1));
  ScriptedSource* s = src.get();
  s->after_success = Verdict::kRestart;
  h.procs.on_spawn = [s](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(2), 0);
    if (p.attempt == 1) s->after_success = Verdict::kFinished;
  };
  EXPECT_EQ(h.Run(std::move(src)), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
  EXPECT_EQ(s->nexts, 2);
  EXPECT_EQ(s->failures, 0);  // nothing failed here: no restart reported by this node
}

}  // namespace
}  // namespace dlrun::launcher::testing
