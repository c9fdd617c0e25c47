// Hang detection (hang_watch.h): by step records, on by default (a rank silent for
// max(K x its p99 gap, --hang-floor) once it has sent kHangMinSteps), and by --hang-timeout (a
// worker that has heartbeated and then goes silent for the timeout). Whole-group idleness needs
// the /proc sampler: tests/multiproc/dlrun_hang_test.cc.
#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

TEST(AgentHang, ASilentWorkerIsStoppedAtTheTimeoutAndTheJobExits124) {
  Harness h(2);
  h.options.hang.timeout = seconds(10);
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
  h.options.hang.timeout = seconds(5);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.HeartbeatsEvery(p.pid, seconds(1), seconds(2));
    if (p.attempt == 1) f.ExitAfter(p.pid, seconds(3), 0);  // the second run finishes
  };
  EXPECT_EQ(h.RunStatic(1), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
}

TEST(AgentHang, AWorkerThatNeverHeartbeatsIsNotWatched) {
  Harness h(1);
  h.options.hang.timeout = seconds(5);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(60), 0);  // silent for a minute, but never said it would heartbeat
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  EXPECT_TRUE(h.procs.sent.empty());
}

StepRecord Step() {
  StepRecord r;
  r.samples = 4;
  r.step_s = 0.1;
  return r;
}

TEST(AgentHang, ByDefaultARankWhoseStepRecordsStopIsStoppedAtTheFloor) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    // Both step every 100 ms; rank 1 stops after 10 s (20 x p99 = 2 s: the 60 s floor rules).
    f.StepsEvery(p.pid, milliseconds(100), p.spec.local_rank == 1 ? seconds(10) : seconds(300),
                 Step());
    f.ExitAfter(p.pid, seconds(400), 0);
  };
  EXPECT_EQ(h.RunStatic(0), Agent::kHangExitCode);
  const pid_t hung = h.procs.procs[1].pid;
  ASSERT_FALSE(h.procs.SentTo(hung).empty());
  EXPECT_EQ(h.procs.SentTo(hung)[0].sig, SIGTERM);
  EXPECT_EQ(h.procs.SentTo(hung)[0].at, seconds(70));
}

TEST(AgentHang, ASlowRankGetsKTimesItsP99GapWhenThatIsLongerThanTheFloor) {
  Harness h(1);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, seconds(5), seconds(50), Step());  // 20 x 5 s = 100 s > 60 s
    f.ExitAfter(p.pid, seconds(400), 0);
  };
  EXPECT_EQ(h.RunStatic(0), Agent::kHangExitCode);
  ASSERT_FALSE(h.procs.sent.empty());
  EXPECT_EQ(h.procs.sent[0].at, seconds(150));
}

TEST(AgentHang, HangFloorSetsTheLeastWait) {
  Harness h(1);
  h.options.hang.step_floor = seconds(3);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, milliseconds(100), seconds(10), Step());
    f.ExitAfter(p.pid, seconds(400), 0);
  };
  EXPECT_EQ(h.RunStatic(0), Agent::kHangExitCode);
  ASSERT_FALSE(h.procs.sent.empty());
  EXPECT_EQ(h.procs.sent[0].at, seconds(13));
}

TEST(AgentHang, ADeclaredPauseIsNotAHang) {
  Harness h(1);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, seconds(1), seconds(10), Step());
    StepRecord pause;
    pause.kind = 'Z';
    pause.what = "eval";
    f.RecordAfter(p.pid, milliseconds(10500), pause);
    StepRecord resume;
    resume.kind = 'z';
    f.RecordAfter(p.pid, seconds(200), resume);  // a 190 s evaluation
    f.ExitAfter(p.pid, seconds(230), 0);         // 30 s after it: within the floor
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  EXPECT_TRUE(h.procs.sent.empty());
}

TEST(AgentHang, TheFirstStepsAreLearntFromNotJudged) {
  Harness h(1);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, seconds(1), seconds(defaults::kHangMinSteps), Step());
    f.ExitAfter(p.pid, seconds(300), 0);  // then a long first epoch's end, say: not judged
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  EXPECT_TRUE(h.procs.sent.empty());
}

TEST(AgentHang, HangDetectOffLeavesASilentRankAlone) {
  Harness h(1);
  h.options.hang.on = false;
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, milliseconds(100), seconds(10), Step());
    f.ExitAfter(p.pid, seconds(400), 0);
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  EXPECT_TRUE(h.procs.sent.empty());
}

TEST(AgentHang, AHangAtTheSameStepTwiceEndsTheJobInsteadOfRestartingAgain) {
  Harness h(1);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, milliseconds(100), seconds(10), Step());  // hangs after step 100
    f.ExitAfter(p.pid, seconds(400), 0);
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/3), Agent::kHangExitCode);
  EXPECT_EQ(h.procs.groups_started(), 2);
}

}  // namespace
}  // namespace dlrun::launcher::testing
