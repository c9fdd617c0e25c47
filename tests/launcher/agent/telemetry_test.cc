// The agent's side of telemetry (docs/TELEMETRY.md) on the fakes: step records become
// cumulative per-rank figures published every period, the final figures are published before
// the agent leaves the rendezvous, a restart keeps the counts, and --telemetry off publishes
// nothing.
#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

StepRecord Step(double step_s, double compute_s, double sync_s) {
  StepRecord r;
  r.samples = 4;
  r.step_s = step_s;
  r.compute_s = compute_s;
  r.sync_s = sync_s;
  r.data_s = 0.01;
  return r;
}

TEST(AgentTelemetry, StepsArePublishedEachPeriodAndTheFinalFiguresBeforeTheLeave) {
  Harness h(2);
  h.options.hostname = "node-a";
  Assignment a;
  a.world_size = 4;
  a.local_world_size = 2;
  a.rank_offset = 2;
  auto src = std::make_unique<ScriptedSource>(a, 0, seconds(1));
  ScriptedSource* s = src.get();
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, milliseconds(100), milliseconds(3000),
                 Step(0.1, p.spec.local_rank == 0 ? 0.08 : 0.06, 0.02));
    f.ExitAfter(p.pid, milliseconds(3050), 0);
  };
  EXPECT_EQ(h.Run(std::move(src)), 0);
  ASSERT_GE(s->published.size(), 3u) << "at 1 s, 2 s, 3 s and the final one";
  // Cumulative: every publication has at least the steps of the one before.
  for (size_t i = 1; i < s->published.size(); ++i) {
    ASSERT_EQ(s->published[i].ranks.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_GE(s->published[i].ranks[r].steps, s->published[i - 1].ranks[r].steps);
    }
  }
  const telemetry::NodeTelemetry& last = s->published.back();
  EXPECT_EQ(s->successes_at_publish.back(), 0) << "the final figures go before the leave";
  EXPECT_EQ(last.hostname, "node-a");
  ASSERT_EQ(last.ranks.size(), 2u);
  for (const telemetry::RankTelemetry& r : last.ranks) {
    EXPECT_EQ(r.rank, 2 + r.local_rank) << "global ranks";
    EXPECT_EQ(r.steps, 30);
    EXPECT_EQ(r.samples, 120);
    EXPECT_NEAR(r.step_s, 3.0, 1e-9);
    EXPECT_NEAR(r.compute_s, r.local_rank == 0 ? 2.4 : 1.8, 1e-9);
    EXPECT_NEAR(r.sync_s, 0.6, 1e-9);
    EXPECT_NEAR(r.data_s, 0.3, 1e-9);
    EXPECT_TRUE(r.has_split);
    EXPECT_TRUE(r.has_data);
    EXPECT_NEAR(r.step_p50_s, 0.1, 1e-9);
    EXPECT_FALSE(r.cpu_utilization.has_value()) << "no sampler in-process";
  }
}

// A worker's CPU time comes whole from its exit (wait4: with the DataLoader workers it reaped),
// not only from the sampler's last read, which can be a period older; a restart adds the next
// process' time to the rank's. Its peak memory too (wait4's ru_maxrss), the largest of the
// rank's processes: before, a job where /proc could not be read had none in its report.
TEST(AgentTelemetry, AWorkersCpuTimeAndPeakMemoryAreTakenWholeAtItsExit) {
  Harness h(1);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 1, seconds(1));
  ScriptedSource* s = src.get();
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, milliseconds(500), milliseconds(1000), Step(0.5, 0.4, 0.1));
    f.ExitAfter(p.pid, milliseconds(1100), p.attempt == 0 ? 1 : 0, p.attempt == 0 ? 1.25 : 0.5,
                p.attempt == 0 ? 300 << 20 : 200 << 20);
  };
  EXPECT_EQ(h.Run(std::move(src)), 0);
  ASSERT_FALSE(s->published.empty());
  const telemetry::RankTelemetry& r = s->published.back().ranks.at(0);
  EXPECT_NEAR(r.cpu_s, 1.75, 1e-9) << "both processes' time";
  EXPECT_EQ(r.rss_peak_bytes, 300 << 20) << "the larger process' peak";
}

// The restart ledger (restart_ledger.h) as the agent feeds it: the fault, the stop, the new
// group, the resume record and the steps after it, all on the fake clock.
TEST(AgentTelemetry, ARestartsPhasesComeFromTheAgentsMarksAndTheWorkersRecords) {
  Harness h(1);
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 1, seconds(1));
  ScriptedSource* s = src.get();
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.attempt == 0) {  // steps 1-4 end at 0.5 s .. 2 s; it fails at 2.1 s
      f.StepsEvery(p.pid, milliseconds(500), milliseconds(2000), Step(0.5, 0.4, 0.1));
      f.ExitAfter(p.pid, milliseconds(2100), 1);
      return;
    }
    StepRecord resume;  // the checkpoint of step 2, loaded in 0.3 s
    resume.kind = RecordKind::kResumed;
    resume.step = 2;
    resume.step_s = 0.3;
    f.RecordAfter(p.pid, milliseconds(800), resume);
    for (int step = 3; step <= 5; ++step) {  // steps 3 and 4 again, then 5: 0.5 s each from 1 s
      StepRecord r = Step(0.5, 0.4, 0.1);
      r.step = step;
      f.RecordAfter(p.pid, milliseconds(1000 + 500 * (step - 2)), r);
    }
    f.ExitAfter(p.pid, milliseconds(2600), 0);
  };
  EXPECT_EQ(h.Run(std::move(src)), 0);
  ASSERT_FALSE(s->published.empty());
  const telemetry::NodeTelemetry& last = s->published.back();
  ASSERT_EQ(last.restarts.size(), 1u);
  const telemetry::RestartCost& c = last.restarts[0];
  EXPECT_EQ(c.restart, 1);
  EXPECT_TRUE(c.resumed);
  EXPECT_EQ(c.fault_step, 4);
  EXPECT_EQ(c.resumed_step, 2);
  EXPECT_EQ(c.recomputed_steps, 2);
  EXPECT_NEAR(c.detection_s, 0.1, 1e-6) << "step 4 ended at 2 s, the exit was seen at 2.1 s";
  EXPECT_NEAR(c.checkpoint_load_s, 0.3, 1e-6);
  EXPECT_NEAR(c.start_s, 0.7, 0.02) << "the group's start to step 3's begin (1 s), less the load";
  EXPECT_NEAR(c.recomputed_s, 1.0, 1e-6) << "steps 3 and 4";
  EXPECT_NEAR(c.total_s(), 2.1 + c.stop_s + c.rendezvous_s, 0.02);
  EXPECT_NEAR(last.lost_s, c.total_s(), 1e-9);
  EXPECT_NEAR(last.productive_s, 5 * 0.5, 1e-9) << "steps 1-5 once; 3 and 4 again are not kept";
}

TEST(AgentTelemetry, ARestartKeepsTheCountsAndOffPublishesNothing) {
  {
    Harness h(1);
    auto src = std::make_unique<ScriptedSource>(Assignment{}, 1, seconds(1));
    ScriptedSource* s = src.get();
    h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
      f.StepsEvery(p.pid, milliseconds(500), milliseconds(2000), Step(0.5, 0.4, 0.1));
      f.ExitAfter(p.pid, milliseconds(2100), p.attempt == 0 ? 1 : 0);
    };
    EXPECT_EQ(h.Run(std::move(src)), 0);
    ASSERT_FALSE(s->published.empty());
    EXPECT_EQ(s->published.back().ranks.at(0).steps, 8) << "4 steps in each of 2 attempts";
  }
  Harness h(1);
  h.options.telemetry.on = false;
  auto src = std::make_unique<ScriptedSource>(Assignment{}, 0, seconds(1));
  ScriptedSource* s = src.get();
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.StepsEvery(p.pid, milliseconds(500), milliseconds(2000), Step(0.5, 0.4, 0.1));
    f.ExitAfter(p.pid, milliseconds(2100), 0);
  };
  EXPECT_EQ(h.Run(std::move(src)), 0);
  EXPECT_TRUE(s->published.empty());
}

}  // namespace
}  // namespace dlrun::launcher::testing
