// What the rendezvous tells a running agent: a new round (scale-up, or a failure on another
// node) restarts the local group without using a restart here; a stop ends the job with 1; and
// the agent keeps heartbeating while it stops a slow group, so it is not declared dead; a wake
// from elsewhere while the agent waits in a join is not the join's answer.
#include <chrono>
#include <thread>

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

// Chaos, two nodes with in-process recovery: node 1 stopped its group and waited in the join
// when node 0's regroup request woke its loop; the agent took the wake for the join's answer
// and ended with "error: pending". Here a wake is already queued when the join starts, and the
// join answers only once the loop has taken that wake and waits again: the agent must start
// the group then, not fail.
TEST(AgentVerdicts, AWakeFromElsewhereDuringTheJoinIsNotItsAnswer) {
  Harness h(2);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 0, seconds(1));
  ScriptedSource* s = src.get();
  s->next_may_block = true;
  FakeProcesses* procs = &h.procs;
  s->on_next = [procs] {
    // Real time: the loop runs on the agent's thread. A loop that ended on the wake never waits
    // again, and the join answers after the deadline, too late.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (procs->blocked_waits() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(2), 0);
  };
  h.procs.Wake();  // a peer's regroup request, say
  EXPECT_EQ(h.Run(std::move(src)), 0);
  EXPECT_EQ(h.procs.groups_started(), 1);
  EXPECT_EQ(s->nexts, 1);
  EXPECT_EQ(h.procs.blocked_waits(), 1);
}

}  // namespace
}  // namespace dlrun::launcher::testing
