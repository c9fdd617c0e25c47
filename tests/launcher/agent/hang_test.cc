// Hang detection (hang_watch.h): by step records, on by default (a rank silent for
// max(K x its p99 gap, --hang-floor) once it has sent kHangMinSteps), and by --hang-timeout (a
// worker that has heartbeated and then goes silent for the timeout). Whole-group idleness needs
// the /proc sampler: tests/multiproc/dlrun_hang_test.cc.
#include <sys/syscall.h>

#include <string>

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

// Every rank's records stop together and no stack can be read (no dump tool): the rank whose main
// thread is not in a futex wait (rank 1, asleep) is named, not the one the hang detection judged
// first (rank 0, the lowest pid), whose main thread waits on its collective's threads.
TEST(AgentHang, WithoutStacksTheRankWhoseMainThreadIsNotInAFutexWaitIsNamed) {
  Harness h(3);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 0, seconds(1));
  ScriptedSource* s = src.get();
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    StepRecord step;
    step.samples = 1;
    step.step_s = 0.1;
    f.StepsEvery(p.pid, milliseconds(100), seconds(10), step);  // then all three silent
    f.facts_said.blocked_calls[p.pid] =
        std::to_string(p.spec.local_rank == 1 ? SYS_clock_nanosleep : SYS_futex) + " 0x0 0x80";
    f.ExitAfter(p.pid, seconds(300), 0);
  };
  EXPECT_EQ(h.Run(std::move(src)), Agent::kHangExitCode);
  ASSERT_EQ(s->failure_reasons.size(), 1u);
  EXPECT_EQ(s->failure_reasons[0].rfind("rank 1 hung: ", 0), 0u) << s->failure_reasons[0];
  EXPECT_NE(s->failure_reasons[0].find("rank 1's main thread is in its own work, the others' wait "
                                       "on their communication threads"),
            std::string::npos) << s->failure_reasons[0];
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
    pause.kind = RecordKind::kPause;
    pause.what = "eval";
    f.RecordAfter(p.pid, milliseconds(10500), pause);
    StepRecord resume;
    resume.kind = RecordKind::kUnpause;
    f.RecordAfter(p.pid, seconds(200), resume);  // a 190 s evaluation
    f.ExitAfter(p.pid, seconds(230), 0);         // 30 s after it: within the floor
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  EXPECT_TRUE(h.procs.sent.empty());
}

// After dlrun_report.done() a rank's teardown (destroy_process_group, the interpreter's exit:
// seconds on a busy node) is no hang, however short its steps were.
TEST(AgentHang, ARankWhoseWorkIsDoneIsNotAHangWhileItExits) {
  Harness h(1);
  h.options.hang.step_floor = seconds(3);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, milliseconds(100), seconds(10), Step());
    StepRecord done;
    done.kind = RecordKind::kDone;
    f.RecordAfter(p.pid, milliseconds(10050), done);
    f.ExitAfter(p.pid, seconds(20), 0);  // 10 s of teardown: over the 3 s floor
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

TEST(HangWatch, AGroupIsIdleOnlyWhenEveryRankAndEveryGpuIsQuietAndNoneIsPaused) {
  const SteadyTime t0 = SteadyTime() + std::chrono::hours(1);
  HangOptions o;
  HangWatch w(o);
  w.Start({11, 12}, t0);
  EXPECT_FALSE(w.IdleFor(t0 + seconds(1)));  // not sampled yet
  w.Cpu({{11, 0.01}, {12, 0.0}}, t0 + seconds(1));
  w.Cpu({{11, 0.01}, {12, 0.0}}, t0 + seconds(31));
  EXPECT_EQ(*w.IdleFor(t0 + seconds(31)), seconds(30));
  EXPECT_TRUE(w.IdleWorthALine(t0 + seconds(31)));
  EXPECT_FALSE(w.IdleIsHang(t0 + seconds(31)));  // no --hang-timeout: a line, no action
  w.MarkIdleReported();
  EXPECT_FALSE(w.IdleWorthALine(t0 + seconds(40)));  // once per spell
  // A GPU at work, one busy rank, one not sampled, one paused: no idle group.
  w.Cpu({{11, 0.01}, {12, 0.0}}, t0 + seconds(41), /*gpu_utilization=*/0.9);
  EXPECT_FALSE(w.IdleFor(t0 + seconds(41)));
  w.Cpu({{11, 0.01}, {12, 0.0}}, t0 + seconds(42));
  w.Cpu({{11, 0.8}, {12, 0.0}}, t0 + seconds(43));
  EXPECT_FALSE(w.IdleFor(t0 + seconds(43)));
  w.Start({21, 22}, t0 + seconds(50));
  w.Cpu({{21, 0.0}}, t0 + seconds(51));
  EXPECT_FALSE(w.IdleFor(t0 + seconds(51)));
  StepRecord pause;
  pause.kind = RecordKind::kPause;
  pause.what = "eval";
  w.Record(22, pause, t0 + seconds(52));
  w.Cpu({{21, 0.0}, {22, 0.0}}, t0 + seconds(53));
  EXPECT_FALSE(w.IdleFor(t0 + seconds(53)));
  // A rank that reads from storage or waits for a CPU at almost no CPU time is busy off the
  // CPU (a cold start paging its libraries in, a crowded machine): no idle group.
  w.Start({41, 42}, t0 + seconds(60));
  w.Cpu({{41, 0.0}, {42, 0.01}}, t0 + seconds(61), 0, /*busy_off_cpu=*/{42});
  w.Cpu({{41, 0.0}, {42, 0.01}}, t0 + seconds(100), 0, {42});
  EXPECT_FALSE(w.IdleFor(t0 + seconds(100)));
  w.Cpu({{41, 0.0}, {42, 0.01}}, t0 + seconds(101));
  EXPECT_EQ(*w.IdleFor(t0 + seconds(131)), seconds(30));  // its reads ended: idle from then
  // With --hang-timeout the idle group is a hang at the timeout.
  o.timeout = seconds(5);
  HangWatch t(o);
  t.Start({31}, t0);
  t.Cpu({{31, 0.0}}, t0 + seconds(1));
  EXPECT_FALSE(t.IdleIsHang(t0 + seconds(5)));
  EXPECT_TRUE(t.IdleIsHang(t0 + seconds(6)));
}

}  // namespace
}  // namespace dlrun::launcher::testing
