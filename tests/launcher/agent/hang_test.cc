// Hang detection (--hang-timeout): a worker that has heartbeated and then goes silent for the
// timeout is treated as failed; one that never heartbeated is not watched.
#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

TEST(AgentHang, ASilentWorkerIsStoppedAtTheTimeoutAndTheJobExits124) {
  Harness h(2);
  h.options.hang_timeout = seconds(10);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    // Rank 0 heartbeats for 3 s, then hangs; rank 1 keeps going for 100 s.
    f.HeartbeatsEvery(p.pid, seconds(1), p.spec.local_rank == 0 ? seconds(3) : seconds(100));
    f.ExitAfter(p.pid, seconds(200), 0);
  };
  EXPECT_EQ(h.RunStatic(0), Agent::kHangExitCode);
  const pid_t hung = h.procs.procs[0].pid;
  ASSERT_FALSE(h.procs.SentTo(hung).empty());
  EXPECT_EQ(h.procs.SentTo(hung)[0].sig, SIGTERM);
  EXPECT_EQ(h.procs.SentTo(hung)[0].at, seconds(13));  // last heartbeat at 3 s + 10 s
}

TEST(AgentHang, AHangRestartsTheGroupWhenRestartsRemain) {
  Harness h(1);
  h.options.hang_timeout = seconds(5);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.HeartbeatsEvery(p.pid, seconds(1), seconds(2));
    if (p.attempt == 1) f.ExitAfter(p.pid, seconds(3), 0);  // the second run finishes
  };
  EXPECT_EQ(h.RunStatic(1), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
}

TEST(AgentHang, AWorkerThatNeverHeartbeatsIsNotWatched) {
  Harness h(1);
  h.options.hang_timeout = seconds(5);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(60), 0);  // silent for a minute, but never said it would heartbeat
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  EXPECT_TRUE(h.procs.sent.empty());
}

}  // namespace
}  // namespace dlrun::launcher::testing
