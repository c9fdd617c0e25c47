// What the rendezvous tells a running agent: a new round (scale-up, or a failure on another
// node) restarts the local group without using a restart here; a stop ends the job with 1; and
// the agent keeps heartbeating while it stops a slow group, so it is not declared dead.
#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

using Verdict = MembershipSource::Verdict;

TEST(AgentVerdicts, ANewRoundRestartsTheGroupWithoutUsingARestart) {
  Harness h(2);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, /*max_restarts=*/0, seconds(1));
  ScriptedSource* s = src.get();
  s->verdicts = {{Verdict::kContinue, ""}, {Verdict::kRestart, "node n3 joined: scale up"}};
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(p.attempt == 0 ? 100 : 4), 0);
  };
  EXPECT_EQ(h.Run(std::move(src)), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
  EXPECT_EQ(s->nexts, 2);
  EXPECT_EQ(s->failures, 0);  // max_restarts 0, and still restarted: scale-up is not a failure
  EXPECT_EQ(h.procs.SentTo(h.procs.procs[0].pid)[0].sig, SIGTERM);
  EXPECT_EQ(h.procs.SentTo(h.procs.procs[0].pid)[0].at, seconds(2));
}

TEST(AgentVerdicts, AStopFromTheRendezvousEndsTheJobWithOne) {
  Harness h(1);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 3, seconds(1));
  src->verdicts = {{Verdict::kStop, "another node ran out of restarts"}};
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(100), 0);
  };
  EXPECT_EQ(h.Run(std::move(src)), 1);
  EXPECT_EQ(h.procs.groups_started(), 1);
}

TEST(AgentVerdicts, TheAgentKeepsHeartbeatingWhileItWaitsOutTheGracePeriod) {
  Harness h(2);
  h.options.grace = seconds(20);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 0, seconds(1));
  ScriptedSource* s = src.get();
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 0) f.ExitAfter(p.pid, milliseconds(500), 1);
    if (p.spec.local_rank == 1) p.ignores_sigterm = true;
  };
  EXPECT_EQ(h.Run(std::move(src)), 1);
  EXPECT_GE(s->checks, 19);  // about one heartbeat a second during the 20 s stop
  EXPECT_EQ(s->failure_reasons, std::vector<std::string>{"rank 0 exited with 1"});
}

}  // namespace
}  // namespace dlrun::launcher::testing
