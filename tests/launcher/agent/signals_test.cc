// Signals that reach the agent: SIGUSR1/SIGUSR2 are passed to every worker's group and the job
// goes on (Slurm's preemption warning); SIGTERM, SIGINT, ... stop the group and dlrun exits
// with 128 + N.
#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

TEST(AgentSignals, Sigusr1IsPassedToEveryWorkerAndTheJobGoesOn) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(5), 0);
    if (p.spec.local_rank == 0) f.SignalAfter(seconds(2), SIGUSR1);
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  for (const auto& p : h.procs.procs) {
    auto s = h.procs.SentTo(p.pid);
    ASSERT_EQ(s.size(), 1u) << "local rank " << p.spec.local_rank;
    EXPECT_EQ(s[0].sig, SIGUSR1);
    EXPECT_EQ(s[0].at, seconds(2));
  }
  EXPECT_EQ(h.procs.groups_started(), 1);  // not a failure: no restart
}

TEST(AgentSignals, SigtermIsForwardedAndStopsTheJob) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(50), 0);
    if (p.spec.local_rank == 0) f.SignalAfter(seconds(3), SIGINT);
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/5), 128 + SIGINT);  // restarts left, but no restart
  EXPECT_EQ(h.procs.groups_started(), 1);
  for (const auto& p : h.procs.procs) EXPECT_EQ(h.procs.SentTo(p.pid)[0].sig, SIGINT);
}

}  // namespace
}  // namespace dlrun::launcher::testing
