// Job telemetry's aggregate (telemetry/telemetry.h) on a fake clock: windows, straggler
// detection (named after K windows above the factor, never in a balanced job), the report and
// its advice, the heartbeat message's validation, the Prometheus text, and a heartbeat through
// the handler reaching the aggregate.
#include "telemetry/telemetry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nlohmann/json.hpp"
#include "rendezvous/handler.h"
#include "rendezvous/job_channel.h"
#include "telemetry/metrics_http.h"
#include "telemetry/profile_json.h"

namespace dlrun::rdzv {
namespace {

using std::chrono::milliseconds;
using TP = telemetry::JobTelemetry::TimePoint;

// Ranks that each did `steps` more steps of `compute` + `sync` seconds since the last call.
struct FakeJob {
  explicit FakeJob(int ranks, telemetry::TelemetryOptions o = {}) : t(std::move(o)), totals(ranks) {
    now = std::chrono::steady_clock::now();
  }
  // One second of steps: rank r computes compute[r] per step, and every rank's step lasts as
  // long as the slowest one's (synchronous DDP): the others wait the difference in the sync.
  void Second(const std::vector<double>& compute, const std::string& node = "n0") {
    double slowest = 0;
    for (double c : compute) slowest = std::max(slowest, c);
    const int steps = static_cast<int>(1.0 / slowest);
    telemetry::NodeTelemetry n;
    n.hostname = node == "n0" ? "host-a" : "host-b";
    for (size_t r = 0; r < compute.size(); ++r) {
      telemetry::RankTelemetry& x = totals[r];
      x.rank = static_cast<int>(r);
      x.steps += steps;
      x.samples += 4 * steps;
      x.step_s += slowest * steps;
      x.compute_s += compute[r] * steps;
      x.sync_s += (slowest - compute[r]) * steps;
      x.has_split = true;
      x.step_p50_s = slowest;
      x.cpu_utilization = 0.9;
      n.ranks.push_back(x);
    }
    now += milliseconds(1000);
    t.Update(node, n.hostname, n, now);
  }
  telemetry::JobTelemetry t;
  std::vector<telemetry::RankTelemetry> totals;
  TP now;
};

TEST(Telemetry, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(telemetry::Median({}), 0);
  EXPECT_EQ(telemetry::Median({3, 1, 2}), 2);
  EXPECT_EQ(telemetry::Median({4, 1, 3, 2}), 2.5);
}

TEST(Telemetry, ABalancedJobNamesNobody) {
  std::vector<std::string> warnings;
  telemetry::TelemetryOptions o;
  o.on_straggler = [&](const std::string& w) { warnings.push_back(w); };
  FakeJob job(8, o);
  for (int s = 0; s < 30; ++s) {
    std::vector<double> c(8, 0.05);
    for (int r = 0; r < 8; ++r) c[r] += 0.005 * ((r + s) % 3);  // jitter well under 20%
    job.Second(c);
  }
  const auto snap = job.t.TakeSnapshot(job.now);
  EXPECT_TRUE(snap.stragglers.empty());
  EXPECT_TRUE(warnings.empty());
  EXPECT_GE(snap.windows, 29);
  EXPECT_EQ(snap.history.size(), static_cast<size_t>(snap.windows));
}

TEST(Telemetry, ASlowRankIsNamedAfterKWindowsAndClearedWhenItRecovers) {
  std::vector<std::string> warnings;
  telemetry::TelemetryOptions o;
  o.straggler_windows = 3;
  o.on_straggler = [&](const std::string& w) { warnings.push_back(w); };
  FakeJob job(4, o);
  job.Second({0.05, 0.05, 0.05, 0.05});
  for (int s = 0; s < 2; ++s) job.Second({0.05, 0.05, 0.08, 0.05});
  EXPECT_TRUE(job.t.TakeSnapshot(job.now).stragglers.empty()) << "two windows are not enough";
  job.Second({0.05, 0.05, 0.08, 0.05});
  auto snap = job.t.TakeSnapshot(job.now);
  ASSERT_EQ(snap.stragglers.size(), 1u);
  EXPECT_EQ(snap.stragglers[0].rank, 2);
  EXPECT_EQ(snap.stragglers[0].host, "host-a");
  EXPECT_EQ(snap.stragglers[0].metric, "compute");
  EXPECT_NEAR(snap.stragglers[0].busy_s, 0.08, 1e-9);
  EXPECT_NEAR(snap.stragglers[0].median_busy_s, 0.05, 1e-9);
  EXPECT_TRUE(snap.stragglers[0].active);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("straggler: rank 2 on host-a computes 0.080 s per step"),
            std::string::npos)
      << warnings[0];
  auto j = nlohmann::json::parse(telemetry::SnapshotJson(snap, false));
  EXPECT_EQ(j["ranks"]["2"]["straggler"], true);
  EXPECT_EQ(j["ranks"]["1"]["straggler"], false);
  // Back to normal: no longer active, still in the report, and no second warning.
  job.Second({0.05, 0.05, 0.05, 0.05});
  snap = job.t.TakeSnapshot(job.now);
  ASSERT_EQ(snap.stragglers.size(), 1u);
  EXPECT_FALSE(snap.stragglers[0].active);
  EXPECT_EQ(warnings.size(), 1u);
  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("advice: rank 2 on host-a was a straggler"), std::string::npos);
  EXPECT_NE(report.find("slowest rank: 2 (compute and data wait per step before the sync"),
            std::string::npos)
      << "every step time is alike in synchronous DDP: the split names it\n" << report;
  EXPECT_EQ(nlohmann::json::parse(telemetry::SnapshotJson(snap, false))["slowest_rank"], 2);
}

TEST(Telemetry, TheFactorIsConfigurable) {
  telemetry::TelemetryOptions o;
  o.straggler_factor = 2.0;
  FakeJob job(4, o);
  for (int s = 0; s < 10; ++s) job.Second({0.05, 0.05, 0.08, 0.05});
  EXPECT_TRUE(job.t.TakeSnapshot(job.now).stragglers.empty()) << "x1.6 is under a factor of 2";
}

TEST(Telemetry, WithoutTheSplitACpuOutlierIsNamed) {
  telemetry::TelemetryOptions o;
  FakeJob job(3, o);
  for (int s = 0; s < 5; ++s) {
    telemetry::NodeTelemetry n;
    n.hostname = "h";
    for (int r = 0; r < 3; ++r) {
      telemetry::RankTelemetry& x = job.totals[r];
      x.rank = r;
      x.steps += 10;
      x.step_s += 1;
      x.cpu_utilization = r == 1 ? 1.0 : 0.4;
      n.ranks.push_back(x);
    }
    job.now += milliseconds(1000);
    job.t.Update("n0", "h", n, job.now);
  }
  auto snap = job.t.TakeSnapshot(job.now);
  ASSERT_EQ(snap.stragglers.size(), 1u);
  EXPECT_EQ(snap.stragglers[0].rank, 1);
  EXPECT_EQ(snap.stragglers[0].metric, "cpu");
}

TEST(Telemetry, TwoNodesAggregateAndTheReportSaysWhatWasLost) {
  FakeJob job(2);
  job.t.SetJob("run-1", 3, 4, 2, 1);
  job.t.AddRestartCause("node host-b: rank 3 exited with 1");
  telemetry::NodeTelemetry b;
  b.hostname = "host-b";
  b.lost_s = 2.5;
  b.memory_limit_bytes = int64_t{200} << 20;  // its two ranks peak at 2 x 100 MiB
  for (int r = 2; r < 4; ++r) {
    telemetry::RankTelemetry x;
    x.rank = r;
    x.steps = 10;
    x.samples = 40;
    x.step_s = 1;
    x.data_s = 0.5;
    x.has_data = true;
    x.rss_peak_bytes = 100 << 20;
    b.ranks.push_back(x);
  }
  // Before the first step the GPU idles (start-up): that sample is left out of its mean.
  telemetry::NodeTelemetry idle;
  idle.hostname = "host-b";
  idle.ranks.push_back({});
  idle.ranks[0].rank = 2;
  idle.gpus.push_back({0, "", 0.0, int64_t{1} << 30, int64_t{40} << 30, {}, 0});
  job.t.Update("n1", "host-b", idle, job.now);
  b.gpus.push_back({0, "", 0.4, int64_t{39} << 30, int64_t{40} << 30, {}, 0});
  job.t.Update("n1", "host-b", b, job.now);
  b.gpus[0].utilization = 0.6;
  b.gpus[0].memory_used_bytes = int64_t{20} << 30;
  job.t.Update("n1", "host-b", b, job.now);
  job.Second({0.05, 0.05});
  auto snap = job.t.TakeSnapshot(job.now);
  EXPECT_EQ(snap.ranks.size(), 4u);
  EXPECT_EQ(snap.ranks.at(3).host, "host-b");
  EXPECT_EQ(snap.lost_s, 2.5);
  ASSERT_EQ(snap.gpus.size(), 1u);
  EXPECT_EQ(snap.gpus[0].host, "host-b");
  EXPECT_NEAR(*snap.gpus[0].mean_utilization, 0.5, 1e-9) << "over the stepping samples";
  EXPECT_EQ(snap.gpus[0].peak_memory_used_bytes, int64_t{39} << 30);
  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("2.5 s lost to 1 restart(s)"), std::string::npos) << report;
  EXPECT_NE(report.find("4 rank(s) on 2 node(s)"), std::string::npos) << report;
  EXPECT_NE(report.find("restart 1: node host-b: rank 3 exited with 1"), std::string::npos);
  EXPECT_NE(report.find("advice: GPU utilization is 50% while ranks wait for data 50% of a step"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("GPU memory is near its limit"), std::string::npos)
      << "a full GPU is what the notes ask for: " << report;
  EXPECT_NE(report.find("advice: the ranks on host-b peaked at 0.2 GiB of its 0.2 GiB memory limit"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("GPU utilization: mean 50%, min 50% over 1 GPU(s); peak memory 39.0 of 40.0 GiB"),
            std::string::npos)
      << report;
  auto j = nlohmann::json::parse(telemetry::SnapshotJson(snap, true));
  for (const char* k : {"wall_s", "restarts", "samples_per_sec", "ranks", "stragglers", "history"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["job"]["run_id"], "run-1");
  EXPECT_NEAR(j["ranks"]["2"]["data_wait_fraction"].get<double>(), 0.5, 1e-9);
  // A smaller round drops the ranks it no longer has.
  job.t.SetJob("run-1", 4, 2, 1, 2);
  EXPECT_EQ(job.t.TakeSnapshot(job.now).ranks.size(), 2u);
}

TEST(Telemetry, PrometheusTextHasEverySeries) {
  FakeJob job(2);
  job.t.SetJob("r", 1, 2, 1, 0);
  for (int s = 0; s < 4; ++s) job.Second({0.05, 0.1});
  const std::string text = telemetry::PrometheusText(job.t.TakeSnapshot(job.now));
  for (const char* series :
       {"dlrun_step_time_seconds{host=\"host-a\",rank=\"0\"}", "dlrun_compute_seconds{rank=\"1\"}",
        "dlrun_sync_wait_seconds{rank=\"0\"}", "dlrun_samples_per_second{rank=\"1\"}",
        "dlrun_cpu_utilization{rank=\"0\"}", "dlrun_straggler{rank=\"1\"} 1",
        "dlrun_straggler{rank=\"0\"} 0", "dlrun_restarts_total 0", "dlrun_nodes 1",
        "dlrun_world_size 2", "# TYPE dlrun_restarts_total counter"}) {
    EXPECT_NE(text.find(series), std::string::npos) << series << "\n" << text;
  }
}

TEST(Telemetry, MalformedTelemetryIsRefusedWithTheField) {
  v1::NodeTelemetry t;
  auto* r = t.add_ranks();
  r->set_step_seconds(std::numeric_limits<double>::quiet_NaN());
  auto bad = telemetry::TelemetryFromProto(t);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected a finite number >= 0"), std::string::npos);
  r->set_step_seconds(1);
  r->set_cpu_utilization(1e9);
  EXPECT_NE(telemetry::TelemetryFromProto(t).status().message().find("CPU utilization"), std::string::npos);
  r->set_cpu_utilization(-1);
  EXPECT_TRUE(telemetry::TelemetryFromProto(t).ok());
  EXPECT_FALSE(telemetry::TelemetryFromProto(t)->ranks[0].cpu_utilization.has_value());
  t.add_gpus()->set_utilization(1.5);
  EXPECT_NE(telemetry::TelemetryFromProto(t).status().message().find("expected 0 to 1"), std::string::npos);
  v1::NodeTelemetry many;
  for (size_t i = 0; i <= telemetry::kMaxTelemetryRanks; ++i) many.add_ranks();
  EXPECT_NE(telemetry::TelemetryFromProto(many).status().message().find("expected at most 1024"),
            std::string::npos);
}

TEST(Telemetry, RoundTripsThroughTheProto) {
  telemetry::NodeTelemetry n;
  n.hostname = "h";
  n.lost_s = 1.5;
  telemetry::RankTelemetry x;
  x.rank = 7;
  x.steps = 3;
  x.data_s = 0.25;
  x.has_data = true;
  x.loss = 0.5;
  x.cpu_utilization = 0.75;
  x.rss_peak_bytes = 1 << 20;
  n.ranks.push_back(x);
  v1::NodeTelemetry p;
  ToProto(n, &p);
  auto back = telemetry::TelemetryFromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hostname, "h");
  ASSERT_EQ(back->ranks.size(), 1u);
  EXPECT_EQ(back->ranks[0].rank, 7);
  EXPECT_EQ(back->ranks[0].data_s, 0.25);
  EXPECT_TRUE(back->ranks[0].has_data);
  EXPECT_FALSE(back->ranks[0].has_split);
  EXPECT_EQ(back->ranks[0].loss, 0.5);
  EXPECT_FLOAT_EQ(static_cast<float>(*back->ranks[0].cpu_utilization), 0.75f);
  EXPECT_EQ(back->ranks[0].rss_peak_bytes, 1 << 20);
  EXPECT_EQ(back->ranks[0].gpu_memory_bytes, -1);
}

// A node-level field end to end (docs/TELEMETRY.md, "Adding a field"): the agent's CPU time
// crosses the wire, is summed over the nodes and reported beside the workers'.
TEST(Telemetry, TheAgentsCpuTimeCrossesTheWireIsSummedAndReportedBesideTheWorkers) {
  telemetry::JobTelemetry job;
  const auto now = std::chrono::steady_clock::now();
  for (const char* host : {"host-a", "host-b"}) {
    telemetry::NodeTelemetry n;
    n.hostname = host;
    n.agent_cpu_s = 0.25;
    telemetry::RankTelemetry r;
    r.rank = host[5] == 'a' ? 0 : 1;
    r.steps = 10;
    r.cpu_s = 50;
    n.ranks.push_back(r);
    v1::NodeTelemetry p;
    ToProto(n, &p);
    auto back = telemetry::TelemetryFromProto(p);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->agent_cpu_s, 0.25);
    job.Update(host, host, *back, now);
  }
  auto snap = job.TakeSnapshot(now);
  EXPECT_DOUBLE_EQ(snap.agent_cpu_s, 0.5);
  snap.wall_s = 10;
  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("dlrun's agents: 0.50 CPU-s, 0.50% of the workers' 100.0 CPU-s"),
            std::string::npos) << report;
  // The same path for warm_spares: the advice does not ask for spares that were on.
  EXPECT_FALSE(snap.warm_spares);
  snap.restarts = 1;
  snap.lost_s = 5;
  EXPECT_NE(telemetry::FormatJobReport(snap, 0).find("or use warm spares (--spare-workers)"),
            std::string::npos);
  telemetry::NodeTelemetry spares;
  spares.warm_spares = true;
  v1::NodeTelemetry sp;
  ToProto(spares, &sp);
  for (const char* host : {"host-a", "host-b"}) {
    job.Update(host, host, *telemetry::TelemetryFromProto(sp), now);
  }
  snap = job.TakeSnapshot(now);
  ASSERT_TRUE(snap.warm_spares);
  snap.wall_s = 10;
  snap.restarts = 1;
  snap.lost_s = 5;
  const std::string with = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(with.find("(warm spares were on): checkpoint more often"), std::string::npos) << with;
  EXPECT_EQ(with.find("use warm spares"), std::string::npos) << with;
  v1::NodeTelemetry bad;
  bad.set_agent_cpu_s(-1);
  EXPECT_NE(telemetry::TelemetryFromProto(bad).status().message().find(
                "telemetry.agent_cpu_s is -1 (expected a finite number >= 0)"),
            std::string::npos);
}

telemetry::RestartCost Cost(int restart, double each, int64_t fault_step, int64_t resumed_step) {
  telemetry::RestartCost c;
  c.restart = restart;
  c.detection_s = c.stop_s = c.rendezvous_s = c.start_s = c.checkpoint_load_s = each;
  c.recomputed_steps = fault_step - resumed_step;
  c.recomputed_s = each;
  c.fault_step = fault_step;
  c.resumed_step = resumed_step;
  c.resumed = true;
  return c;
}

TEST(Telemetry, EachRestartCostsWhatItsSlowestNodeLostAndGoodputIsKeptStepsOverWall) {
  FakeJob job(2);
  job.t.SetJob("r", 1, 4, 2, 0);
  job.t.SetJob("r", 2, 2, 1, 2);  // a node was lost: the job's largest shape stays known
  job.t.AddRestartCause("node host-b: rank 3 exited with 1");
  job.t.AddRestartCause("the rendezvous host was lost");
  telemetry::NodeTelemetry a, b;
  a.hostname = "host-a";
  b.hostname = "host-b";
  a.restarts = {Cost(1, 0.1, 55, 50), Cost(2, 0.5, 70, 60)};  // host-a lost more to restart 2
  b.restarts = {Cost(1, 0.2, 55, 50)};                        // host-b more to restart 1
  a.productive_s = 30;
  b.productive_s = 20;
  job.now += milliseconds(60000);  // 60 s of wall time
  job.t.Update("n0", "host-a", a, job.now);
  job.t.Update("n1", "host-b", b, job.now);
  const auto snap = job.t.TakeSnapshot(job.now);
  ASSERT_EQ(snap.restart_costs.size(), 2u);
  EXPECT_EQ(snap.restart_costs[0].host, "host-b");
  EXPECT_EQ(snap.restart_costs[1].host, "host-a");
  EXPECT_NEAR(snap.lost_s, 6 * 0.2 + 6 * 0.5, 1e-9);
  EXPECT_EQ(snap.productive_s, 30);
  EXPECT_EQ(snap.max_world_size, 4);
  EXPECT_EQ(snap.max_nodes, 2);

  const nlohmann::json j = nlohmann::json::parse(telemetry::SnapshotJson(snap, false));
  EXPECT_NEAR(j["lost"]["total_s"].get<double>(), 4.2, 1e-9);
  EXPECT_NEAR(j["lost"]["by_phase"]["start_s"].get<double>(), 0.7, 1e-9);
  EXPECT_EQ(j["lost"]["recomputed_steps"], 15);
  ASSERT_EQ(j["lost"]["restarts"].size(), 2u);
  EXPECT_EQ(j["lost"]["restarts"][1]["resumed_step"], 60);
  EXPECT_EQ(j["lost"]["restarts"][1]["fault_step"], 70);
  EXPECT_NEAR(j["goodput"].get<double>(), 30.0 / snap.wall_s, 1e-9);
  EXPECT_EQ(j["job"]["max_world_size"], 4);

  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("2 rank(s) on 1 node(s) (at most 4 on 2)"), std::string::npos) << report;
  EXPECT_NE(report.find("restart 1: node host-b: rank 3 exited with 1; 1.20 s lost (on host-b): "
                        "detection 0.20, stop 0.20, rendezvous 0.20, start 0.20, checkpoint load "
                        "0.20, 5 step(s) recomputed 0.20 (resumed from step 50)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("restart 2: the rendezvous host was lost; 3.00 s lost (on host-a)"),
            std::string::npos)
      << report;

  const std::string text = telemetry::PrometheusText(snap);
  for (const char* series :
       {"dlrun_restart_phase_seconds{phase=\"detection\"} 0.7",
        "dlrun_restart_phase_seconds{phase=\"recomputed\"} 0.7", "dlrun_recomputed_steps 15",
        "dlrun_lost_seconds 4.2"}) {
    EXPECT_NE(text.find(series), std::string::npos) << series << "\n" << text;
  }
  const size_t g = text.find("\ndlrun_goodput_ratio ");
  ASSERT_NE(g, std::string::npos) << text;
  EXPECT_NEAR(std::stod(text.substr(g + 21)), 0.5, 1e-3);
}

// In-process spans within one restart are told apart by their generation (each counted once,
// as its slowest node saw it), and a node's admission is named as such, through the proto.
TEST(Telemetry, InProcessGenerationsAreEachCountedAndAnAdmissionIsNamed) {
  FakeJob job(2);
  job.t.SetJob("r", 0, 4, 2, 0);
  auto in_process = [](int generation, double each, bool admission) {
    telemetry::RestartCost c = Cost(0, 0, 20 * generation, -1);
    c.recomputed_steps = 0;
    c.detection_s = c.start_s = c.state_from_peer_s = each;
    c.in_process = true;
    c.admission = admission;
    c.generation = generation;
    return c;
  };
  telemetry::NodeTelemetry a, b;
  a.hostname = "host-a";
  b.hostname = "host-b";
  a.restarts = {in_process(1, 0.1, false), in_process(2, 0.3, true)};
  b.restarts = {in_process(1, 0.2, false), in_process(2, 0.1, true)};
  b.restarts[0].restarts = 3;  // three faults in the span: each a recovery, none a restart
  b.restarts[0].in_process_tries = 2;
  b.restarts[0].started_forked = 1;  // the last replacement: forked from the fork server
  a.restarts[1].started_forked = 2;  // an admitted node's: two forked, one cold
  a.restarts[1].started_cold = 1;
  job.now += milliseconds(10000);
  for (telemetry::NodeTelemetry* n : {&a, &b}) {
    v1::NodeTelemetry p;
    ToProto(*n, &p);
    auto back = telemetry::TelemetryFromProto(p);
    ASSERT_TRUE(back.ok()) << back.status();
    job.t.Update(n == &a ? "n0" : "n1", n->hostname, *back, job.now);
  }
  const auto snap = job.t.TakeSnapshot(job.now);
  ASSERT_EQ(snap.restart_costs.size(), 2u);
  EXPECT_EQ(snap.restart_costs[0].host, "host-b");
  EXPECT_EQ(snap.restart_costs[1].host, "host-a");
  EXPECT_NEAR(snap.lost_s, 3 * 0.2 + 3 * 0.3, 1e-9);
  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("in-process recovery after step 20: 0.60 s lost (on host-b)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("recomputed 0.00 over 3 in-process recoveries\n"), std::string::npos)
      << report;
  EXPECT_NE(report.find("detection 0.20, start 0.20 (forked), state from peer"), std::string::npos)
      << report;
  EXPECT_NE(report.find("start 0.30 (2 forked, 1 cold), state from peer"), std::string::npos)
      << report;
  EXPECT_NE(report.find("in-process recovery after step 20: 0.60 s lost (on host-b)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("a node admitted after step 40: 0.90 s lost (on host-a)"),
            std::string::npos)
      << report;
  const nlohmann::json j = nlohmann::json::parse(telemetry::SnapshotJson(snap, false));
  EXPECT_FALSE(j["lost"]["restarts"][0]["admission"].get<bool>());
  EXPECT_TRUE(j["lost"]["restarts"][1]["admission"].get<bool>());
  EXPECT_EQ(j["lost"]["restarts"][1]["generation"], 2);
  EXPECT_EQ(j["lost"]["restarts"][0]["in_process_recoveries"], 3);
  EXPECT_EQ(j["lost"]["restarts"][0]["started"]["forked"], 1);
  EXPECT_EQ(j["lost"]["restarts"][1]["started"]["cold"], 1);
  EXPECT_EQ(j["lost"]["restarts"][0]["group_restarts"], 0);
  EXPECT_EQ(j["lost"]["restarts"][1]["in_process_recoveries"], 1);
}

TEST(Telemetry, ARestartCostOutOfRangeIsRefusedNamingIt) {
  telemetry::NodeTelemetry n;
  n.restarts = {Cost(1, 0.1, 5, 0)};
  v1::NodeTelemetry p;
  ToProto(n, &p);
  auto back = telemetry::TelemetryFromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->restarts.size(), 1u);
  EXPECT_EQ(back->restarts[0].recomputed_steps, 5);
  EXPECT_TRUE(back->restarts[0].resumed);
  p.mutable_restarts(0)->set_stop_s(-1);
  EXPECT_NE(telemetry::TelemetryFromProto(p).status().message().find("restart 1 has a phase of -1"),
            std::string::npos)
      << telemetry::TelemetryFromProto(p).status();
  p.mutable_restarts(0)->set_stop_s(0);
  p.mutable_restarts(0)->set_resumed_step(-7);
  EXPECT_NE(telemetry::TelemetryFromProto(p).status().message().find(
                "resumed at -7, generation 0, 0 in-process tries) is out of range"),
            std::string::npos);
  v1::NodeTelemetry many;
  for (size_t i = 0; i <= telemetry::kMaxRestartCosts; ++i) many.add_restarts();
  EXPECT_NE(telemetry::TelemetryFromProto(many).status().message().find("restarts (expected at most 64)"),
            std::string::npos);
  v1::NodeTelemetry nan;
  nan.set_productive_s(std::numeric_limits<double>::quiet_NaN());
  EXPECT_NE(telemetry::TelemetryFromProto(nan).status().message().find("productive_s"), std::string::npos);
}

TEST(Telemetry, EachNodesProfilesAreInTheReportAndItsJsonWithTheirHost) {
  FakeJob job(2);
  telemetry::NodeTelemetry a, b;
  telemetry::RankProfile p1;
  p1.rank = 1;
  p1.tool = "py-spy";
  p1.path = "/logs/run/profile/rank1.svg";
  p1.hot = {{"hot_function (train.py)", 0.41}, {"step (train.py)", 0.2}};
  a.profiles = {p1};
  telemetry::RankProfile p3;
  p3.rank = 3;
  p3.tool = "py-spy";
  p3.note = "no samples: py-spy could not attach (Permission denied)";
  b.profiles = {p3};
  job.t.Update("n0", "host-a", a, job.now);
  job.t.Update("n1", "host-b", b, job.now);
  job.t.Update("n0", "host-a", telemetry::NodeTelemetry{}, job.now);  // a node that stops sending keeps its
  const auto snap = job.t.TakeSnapshot(job.now);
  ASSERT_EQ(snap.profiles.size(), 2u);
  EXPECT_EQ(snap.profiles.at(1).host, "host-a");
  EXPECT_EQ(snap.profiles.at(3).host, "host-b");
  const nlohmann::json j = nlohmann::json::parse(telemetry::SnapshotJson(snap, false));
  EXPECT_EQ(j["profiles"], nlohmann::json({{"1", "/logs/run/profile/rank1.svg"}}))
      << "only ranks with a file; the others' notes are in profile_details";
  ASSERT_EQ(j["profile_details"].size(), 2u);
  EXPECT_EQ(j["profile_details"][0]["hot"][0]["frame"], "hot_function (train.py)");
  EXPECT_EQ(j["profile_details"][1]["note"], p3.note);
  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("profile of rank 1 (py-spy on host-a): /logs/run/profile/rank1.svg\n"
                        "    rank 1: 41% in hot_function (train.py); 20% in step (train.py)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("profile of rank 3 (py-spy on host-b): none (no samples: py-spy could "
                        "not attach (Permission denied))"),
            std::string::npos)
      << report;
}

// A share says what it is a share of: 4 samples give shares in steps of 25%, so the count is
// shown, and a count under kProfileFewSamples is called rough; the count survives the proto.
TEST(Telemetry, AProfilesSharesComeWithTheirSampleCount) {
  telemetry::NodeTelemetry n;
  telemetry::RankProfile p;
  p.rank = 1;
  p.tool = "perf";
  p.path = "/logs/rank1.svg";
  p.samples = 4;
  p.hot = {{"conv3d", 0.5}, {"relu", 0.25}};
  n.profiles = {p};
  v1::NodeTelemetry wire;
  ToProto(n, &wire);
  auto back = telemetry::TelemetryFromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->profiles.size(), 1u);
  EXPECT_EQ(back->profiles[0].samples, 4);
  std::string text = telemetry::ProfileText(back->profiles[0], "");
  EXPECT_NE(text.find("rank 1 (4 samples): 50% in conv3d; 25% in relu (few samples: the shares "
                      "are rough; profile more steps or longer)"),
            std::string::npos) << text;
  p.samples = 4000;
  text = telemetry::ProfileText(p, "");
  EXPECT_NE(text.find("rank 1 (4000 samples): 50% in conv3d; 25% in relu"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("few samples"), std::string::npos) << text;
  EXPECT_EQ(telemetry::ProfileDetailJson(p)["samples"], 4000);
}

// host-a with 16 GiB of machine memory and its rank 0, whose resident memory peaked at `peak`.
telemetry::NodeTelemetry HostA(int64_t peak) {
  telemetry::NodeTelemetry n;
  n.hostname = "host-a";
  n.memory_limit_bytes = int64_t{16} << 30;
  n.memory_limit_source = "machine memory";
  telemetry::RankTelemetry r;
  r.rank = 0;
  r.rss_peak_bytes = peak;
  n.ranks.push_back(r);
  return n;
}

// The warm spares' memory (~380 MB each, issue 55) crosses the wire and is named in the memory
// line beside the ranks' peak, which leaves it out.
TEST(Telemetry, TheWarmSparesMemoryIsReportedBesideTheRanksPeak) {
  telemetry::JobTelemetry job;
  const auto now = std::chrono::steady_clock::now();
  telemetry::NodeTelemetry n = HostA(int64_t{1} << 30);
  n.ranks[0].steps = 4;
  n.warm_spares = true;
  n.spare_rss_peak_bytes = int64_t{3} << 28;  // 0.75 GiB
  v1::NodeTelemetry p;
  ToProto(n, &p);
  auto back = telemetry::TelemetryFromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->spare_rss_peak_bytes, n.spare_rss_peak_bytes);
  job.Update("n0", "host-a", *back, now);
  auto snap = job.TakeSnapshot(now);
  snap.wall_s = 10;
  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("memory on host-a: peak 1.00 GiB of 16.00 GiB (machine memory), 6%, and "
                        "768 MiB more for ready processes (the fork server, warm spares: "
                        "their share of anonymous memory)"),
            std::string::npos)
      << report;
}

// A job of a few milliseconds (`dlrun --no-python echo hi`): its memory in MiB, and the agents'
// CPU time without a share of the workers' next to nothing (before: "peak 0.00 GiB", "227.98% of
// the workers' 0.0 CPU-s").
TEST(Telemetry, AShortJobsMemoryAndTheAgentsTimeReadAsFiguresPeopleUse) {
  telemetry::JobTelemetry job;
  const auto now = std::chrono::steady_clock::now();
  telemetry::NodeTelemetry n = HostA(int64_t{2} << 20);
  n.ranks[0].cpu_s = 0.004;
  n.agent_cpu_s = 0.01;
  job.Update("n0", "host-a", n, now);
  auto snap = job.TakeSnapshot(now);
  snap.wall_s = 1;
  const std::string report = telemetry::FormatJobReport(snap, 0);
  EXPECT_NE(report.find("memory on host-a: peak 2 MiB of 16.00 GiB (machine memory), 0%"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("dlrun's agents: 0.01 CPU-s, the workers' 0.00 CPU-s"), std::string::npos)
      << report;
  EXPECT_EQ(report.find("% of the workers'"), std::string::npos) << report;
}

TEST(Telemetry, AProfileOutOfRangeIsRefusedNamingIt) {
  telemetry::NodeTelemetry n;
  telemetry::RankProfile p;
  p.rank = 2;
  p.tool = "perf";
  p.path = "/x/rank2.svg";
  p.hot = {{"conv3d", 0.5}};
  n.profiles = {p};
  v1::NodeTelemetry m;
  ToProto(n, &m);
  auto back = telemetry::TelemetryFromProto(m);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->profiles.size(), 1u);
  EXPECT_EQ(back->profiles[0].hot[0].first, "conv3d");
  m.mutable_profiles(0)->mutable_hot(0)->set_fraction(1.5);
  EXPECT_NE(telemetry::TelemetryFromProto(m).status().message().find(
                "telemetry.profiles[rank 2].hot.fraction is 1.5 (expected 0 to 1)"),
            std::string::npos)
      << telemetry::TelemetryFromProto(m).status();
  m.mutable_profiles(0)->mutable_hot(0)->set_fraction(0.5);
  m.mutable_profiles(0)->set_tool("");
  EXPECT_NE(telemetry::TelemetryFromProto(m).status().message().find("profiles[rank 2].tool is empty"),
            std::string::npos);
  m.mutable_profiles(0)->set_tool("perf");
  for (int i = 0; i < 8; ++i) m.mutable_profiles(0)->add_hot()->set_frame("f");
  EXPECT_NE(telemetry::TelemetryFromProto(m).status().message().find("9 hot frames (expected at most 8)"),
            std::string::npos);
}

TEST(Telemetry, APublishedTelemetryReachesTheAggregateAndBadFiguresAreDroppedAndSaid) {
  HandlerOptions o;
  o.run_id = "r";
  o.token = "t";
  o.telemetry = std::make_shared<telemetry::JobTelemetry>();
  std::vector<std::string> refused;
  o.on_refused = [&](const absl::Status& s, const std::string&) {
    refused.emplace_back(s.message());
  };
  Handler h(o);
  v1::JoinRequest j;
  j.mutable_auth()->set_protocol_version(kProtocolVersion);
  j.mutable_auth()->set_run_id("r");
  j.mutable_auth()->set_token("t");
  j.mutable_node()->set_node_id("a");
  j.mutable_node()->set_hostname("host-a");
  j.mutable_node()->set_address("10.0.0.1");
  j.mutable_node()->set_nproc(1);
  j.mutable_node()->set_slurm_node_id(-1);
  bool joined = false;
  h.Join(j, "p", h.NewTicket(), [&](const absl::Status& s, const v1::JoinResponse&) {
    joined = s.ok();
  });
  ASSERT_TRUE(joined);
  h.Tick();
  ChannelHandler channel(h);
  v1::PublishRequest hb;
  *hb.mutable_auth() = j.auth();
  hb.set_node_id("a");
  hb.mutable_telemetry()->set_hostname("host-a");
  auto* r = hb.mutable_telemetry()->add_ranks();
  r->set_steps(5);
  r->set_step_seconds(0.5);
  v1::PublishResponse resp;
  ASSERT_TRUE(channel.Publish(hb, "p", &resp).ok());
  auto snap = o.telemetry->TakeSnapshot(std::chrono::steady_clock::now());
  ASSERT_EQ(snap.ranks.size(), 1u);
  EXPECT_EQ(snap.ranks.at(0).steps, 5);
  EXPECT_EQ(snap.ranks.at(0).host, "host-a");
  EXPECT_EQ(snap.world_size, 1);
  EXPECT_EQ(snap.state, "running");
  r->set_step_seconds(-1);
  ASSERT_TRUE(channel.Publish(hb, "p", &resp).ok()) << "bad figures do not end the exchange";
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("has a time of -1"), std::string::npos) << refused[0];
  EXPECT_EQ(o.telemetry->TakeSnapshot(std::chrono::steady_clock::now()).ranks.at(0).step_s, 0.5)
      << "the bad figures were dropped";
}

// A program without step records names no step ("after step -1") and says what the time was
// counted up to.
TEST(JobReport, AnInProcessRecoveryWithoutStepRecordsNamesNoStep) {
  telemetry::JobTelemetry::Snapshot s;
  s.wall_s = 10;
  s.ranks[0].host = "h";
  telemetry::RestartCost c;
  c.host = "h";
  c.in_process = true;
  c.resumed = true;
  c.generation = 1;
  c.start_s = 1.55;
  c.state_from_peer_s = 0.4;
  s.restart_costs = {c};
  const std::string report = telemetry::FormatJobReport(s, 0);
  EXPECT_NE(report.find("in-process recovery before any step record: 1.95 s lost (on h)"),
            std::string::npos) << report;
  EXPECT_NE(report.find("(no step records: counted up to the recovery's end)"), std::string::npos)
      << report;
  EXPECT_EQ(report.find("step -1"), std::string::npos) << report;
  EXPECT_EQ(report.find("so far"), std::string::npos) << report;
  // The header counts it (before: "lost to 0 restart(s) and rendezvous" and nothing else).
  EXPECT_NE(report.find("lost to 0 restart(s), 1 in-process recovery and rendezvous"),
            std::string::npos)
      << report;
  s.restart_costs.push_back(c);
  s.restart_costs.back().admission = true;  // a node admitted: no recovery
  s.restart_costs.push_back(c);
  s.restart_costs.back().restarts = 2;  // a fault during the recovery: two in the span
  EXPECT_NE(telemetry::FormatJobReport(s, 0).find(", 3 in-process recoveries and rendezvous"),
            std::string::npos)
      << telemetry::FormatJobReport(s, 0);
}

// The report says the restarts and the in-process recoveries in the order they came (before:
// every in-process recovery first, then the restarts), a restart that no node measured where its
// number falls.
TEST(JobReport, RestartsAndInProcessRecoveriesAreSaidInTheOrderTheyCame) {
  telemetry::JobTelemetry::Snapshot s;
  s.wall_s = 10;
  auto in_process = [](int restart, int generation, int64_t fault_step) {
    telemetry::RestartCost c = Cost(restart, 0.01, fault_step, fault_step);
    c.in_process = true;
    c.generation = generation;
    c.host = "h";
    return c;
  };
  telemetry::RestartCost r1 = Cost(1, 0.02, 7, 4);
  r1.host = "h";
  s.restart_costs = {in_process(0, 1, 3), r1, in_process(1, 1, 19)};
  s.restart_causes = {"rank 1 got SIGKILL", "rank 0 got SIGTERM"};
  const std::string report = telemetry::FormatJobReport(s, 1);
  const size_t a = report.find("in-process recovery after step 3:"),
               b = report.find("restart 1: rank 1 got SIGKILL; "),
               c = report.find("in-process recovery after step 19:"),
               d = report.find("restart 2: rank 0 got SIGTERM");
  ASSERT_NE(d, std::string::npos) << report;
  EXPECT_LT(a, b) << report;
  EXPECT_LT(b, c) << report;
  EXPECT_LT(c, d) << report;
}

// A restart after an in-process recovery that did not finish: one restart, said so, with the
// fault the recovery began with as its cause (the agent's), across the proto.
TEST(JobReport, ARestartAfterAFailedInProcessRecoveryIsOneRestartSaidSo) {
  telemetry::RestartCost c = Cost(1, 0.2, 5, 3);
  c.restarts = 2;
  c.in_process_tries = 1;
  telemetry::NodeTelemetry n;
  n.restarts = {c};
  v1::NodeTelemetry wire;
  ToProto(n, &wire);
  auto back = telemetry::TelemetryFromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->restarts.size(), 1u);
  EXPECT_EQ(back->restarts[0].in_process_tries, 1);
  telemetry::JobTelemetry::Snapshot s;
  s.wall_s = 10;
  s.restart_costs = back->restarts;
  s.restart_causes = {"rank 1 (local rank 1, pid 7): SIGKILL, and the in-process recovery after it "
                      "failed (rank 0 exited with 1)"};
  const std::string report = telemetry::FormatJobReport(s, 0);
  EXPECT_NE(report.find("restart 1: rank 1 (local rank 1, pid 7): SIGKILL, and the in-process"),
            std::string::npos) << report;
  EXPECT_NE(report.find("(resumed from step 3), after an in-process recovery that did not get "
                        "past step 5"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("state from peer"), std::string::npos) << "none arrived: " << report;
  // The replacement took the state and failed again before the step passed: the transfer the
  // span's total holds is said.
  s.restart_costs[0].state_from_peer_s = 0.05;
  EXPECT_NE(telemetry::FormatJobReport(s, 0).find("did not get past step 5 (state from peer 0.05)"),
            std::string::npos)
      << telemetry::FormatJobReport(s, 0);
  s.restart_costs[0].state_from_peer_s = 0;
  EXPECT_EQ(report.find("over 2 restarts"), std::string::npos) << report;
  EXPECT_NE(report.find("lost to 0 restart(s), 1 in-process recovery and rendezvous"),
            std::string::npos)
      << "the header counts the recovery tried: " << report;
  const nlohmann::json j = nlohmann::json::parse(telemetry::SnapshotJson(s, false));
  EXPECT_EQ(j["lost"]["restarts"][0]["in_process_recoveries"], 1) << j.dump();
  EXPECT_EQ(j["lost"]["restarts"][0]["group_restarts"], 1) << j.dump();
  wire.mutable_restarts(0)->set_in_process_tries(3);  // more tries than the span's faults
  EXPECT_FALSE(telemetry::TelemetryFromProto(wire).ok());
}

// A node's own report (not the rendezvous host's: the job's causes are not at hand) names the
// cause its agent gave for a restart of its own ranks' failure, and no other.
TEST(JobReport, ANodesOwnReportNamesTheCauseOfItsOwnRanksFailure) {
  telemetry::RestartCost own = Cost(1, 0.2, 5, 3);
  own.cause = "rank 3 (local rank 1, pid 9): SIGKILL";
  telemetry::RestartCost other = Cost(2, 0.2, 8, 6);
  telemetry::JobTelemetry::Snapshot s;
  s.wall_s = 10;
  s.restart_costs = {own, other};
  const std::string report = telemetry::FormatJobReport(s, 0);
  EXPECT_NE(report.find("restart 1: rank 3 (local rank 1, pid 9): SIGKILL; "), std::string::npos)
      << report;
  EXPECT_NE(report.find("restart 2: (cause not recorded); "), std::string::npos) << report;
  s.restart_causes = {"the job's own word for it"};  // the host's list comes first
  EXPECT_NE(telemetry::FormatJobReport(s, 0).find("restart 1: the job's own word for it; "),
            std::string::npos);
}

TEST(JobReport, SaysWhatSamplesPerSecondIsOverAndWhenThereAreNoStepRecords) {
  telemetry::JobTelemetry::Snapshot s;
  s.wall_s = 10;
  s.ranks[0].host = "h";
  s.ranks[1].host = "h";
  std::string report = telemetry::FormatJobReport(s, 0);
  EXPECT_NE(report.find("2 rank(s) on 1 node(s), no step records (Python: dlrun_report"),
            std::string::npos) << report;
  EXPECT_NE(report.find("rank 1 (h): no step records"), std::string::npos) << report;
  EXPECT_EQ(report.find("samples/s"), std::string::npos) << report;
  // Nobody is the slowest rank without step records (it said "rank 0 (step time p50 0.000 s)").
  EXPECT_EQ(report.find("slowest rank"), std::string::npos) << report;
  EXPECT_TRUE(nlohmann::json::parse(telemetry::SnapshotJson(s, false))["slowest_rank"].is_null());
  // 2 ranks x 40 samples in 2 s of their own step time each; the job took 10 s of wall clock.
  for (int rank : {0, 1}) {
    s.ranks[rank].steps = 4;
    s.ranks[rank].samples = 40;
    s.ranks[rank].step_s = 2;
  }
  s.samples_per_sec = 40.0;
  report = telemetry::FormatJobReport(s, 0);
  EXPECT_NE(report.find("40.00 samples/s over the ranks' step times (8.00 over the wall clock)"),
            std::string::npos) << report;
  EXPECT_NE(report.find("rank 1 (h): 4 steps"), std::string::npos) << report;
}

}  // namespace
}  // namespace dlrun::rdzv
