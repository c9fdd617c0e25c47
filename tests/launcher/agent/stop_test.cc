// Stopping a group: SIGTERM to every worker's process group, SIGKILL after --grace-period, and a
// bounded wait after SIGKILL (a worker stuck in the kernel is named, and the agent goes on).
#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

TEST(AgentStop, GracePeriodThenSigkillForAWorkerThatIgnoresSigterm) {
  Harness h(2);
  h.options.grace = seconds(30);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 0) f.ExitAfter(p.pid, seconds(1), 2);  // fails at 1 s
    if (p.spec.local_rank == 1) p.ignores_sigterm = true;
  };
  EXPECT_EQ(h.RunStatic(0), 2);
  const auto s = h.procs.SentTo(h.procs.procs[1].pid);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].sig, SIGTERM);
  EXPECT_EQ(s[0].at, seconds(1));
  EXPECT_EQ(s[1].sig, SIGKILL);
  EXPECT_EQ(s[1].at, seconds(31));  // exactly the grace period later
}

TEST(AgentStop, AWorkerThatStopsOnSigtermIsNotKilledBeforeItsTime) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 0) f.ExitAfter(p.pid, seconds(1), 2);
  };
  EXPECT_EQ(h.RunStatic(0), 2);
  // The SIGKILL that follows goes to the already-empty group (children it may have left), at
  // once: nobody waited the 30 s grace period.
  EXPECT_EQ(h.clock.Elapsed(), milliseconds(1010));
}

TEST(AgentStop, AnUnkillableWorkerDoesNotHangTheAgent) {
  Harness h(2);
  h.options.grace = seconds(3);
  h.options.kill_wait = seconds(4);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 0) f.ExitAfter(p.pid, seconds(1), 5);
    if (p.spec.local_rank == 1) p.unkillable = true;  // D state: not even SIGKILL ends it
  };
  EXPECT_EQ(h.RunStatic(0), 5);
  EXPECT_EQ(h.clock.Elapsed(), seconds(1 + 3 + 4));
}

}  // namespace
}  // namespace dlrun::launcher::testing
