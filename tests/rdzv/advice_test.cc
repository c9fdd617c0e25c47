// The end-of-job report speaks as the tuning notes do (docs/TELEMETRY.md, "Advice"), checked on
// crafted telemetry: each advice line appears exactly when its condition holds, CPU efficiency
// is counted against the CPUs allocated (as seff), memory against the request or limit, and
// train_unet's advice names only flags train_unet has.
#include <gtest/gtest.h>

#include <fstream>
#include <cctype>
#include <set>
#include <sstream>

#include "nlohmann/json.hpp"
#include "telemetry/telemetry.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::rdzv {
namespace {

struct Job {
  double gpu_util = -1;        // < 0: no GPUs
  double gpu_mem = 0.3;        // peak GPU memory, fraction of 40 GiB
  int gpus = 4;
  double data_wait = 0.0;      // fraction of a step
  double cpu_busy = 0.2;       // of the CPUs allocated
  double cpus = 8;
  std::string program = "train.py";
  double rss_fraction = 0.2;   // of the memory request
};

telemetry::JobTelemetry::Snapshot Make(const Job& j) {
  telemetry::JobTelemetry::Snapshot s;
  s.run_id = "r";
  s.world_size = 2;
  s.nodes = 1;
  s.wall_s = 100;
  s.program = j.program;
  telemetry::JobTelemetry::Snapshot::NodeMemory m;
  m.host = "node-a";
  m.cpus = j.cpus;
  m.cpus_source = "Slurm cpus-per-task";
  m.limit_bytes = int64_t{8} << 30;
  m.limit_source = "Slurm --mem";
  m.ranks = 2;
  m.cpu_s = j.cpu_busy * j.cpus * s.wall_s;
  for (int r = 0; r < 2; ++r) {
    telemetry::RankTelemetry x;
    x.rank = r;
    x.host = "node-a";
    x.steps = 100;
    x.samples = 400;
    x.step_s = 90;
    x.data_s = j.data_wait * x.step_s;
    x.has_data = true;
    x.step_p50_s = x.step_p95_s = 0.9;
    x.cpu_s = m.cpu_s / 2;
    x.rss_peak_bytes = static_cast<int64_t>(j.rss_fraction * static_cast<double>(m.limit_bytes) / 2);
    m.peak_rss_bytes += x.rss_peak_bytes;
    s.ranks[r] = x;
  }
  s.node_memory.push_back(m);
  if (j.gpu_util >= 0) {
    for (int g = 0; g < j.gpus; ++g) {
      telemetry::GpuTelemetry t;
      t.index = g;
      t.host = "node-a";
      t.utilization = j.gpu_util;
      t.mean_utilization = j.gpu_util;
      t.memory_total_bytes = int64_t{40} << 30;
      t.memory_used_bytes = t.peak_memory_used_bytes =
          static_cast<int64_t>(j.gpu_mem * static_cast<double>(t.memory_total_bytes));
      s.gpus.push_back(t);
    }
  }
  return s;
}

std::vector<std::string> AdviceLines(const std::string& report) {
  std::vector<std::string> out;
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  advice: ", 0) == 0) out.push_back(line.substr(10));
  }
  return out;
}

int Count(const std::vector<std::string>& lines, const std::string& needle) {
  int n = 0;
  for (const std::string& l : lines) n += l.find(needle) != std::string::npos;
  return n;
}

constexpr char kDataLine[] = "data loading holds the GPUs back";
constexpr char kOtherLine[] = "not data loading";

// Restarts that cost much get the advice of the phase that cost the most: "checkpoint more
// often" only where recomputing was it (it was given when a warm spare's start cost the time).
TEST(Advice, CostlyRestartsAreAdvisedByTheirLargestPhase) {
  struct Case {
    double telemetry::RestartCost::*phase;
    bool spares;
    const char* says;
    const char* not_says;
  };
  using RC = telemetry::RestartCost;
  const Case cases[] = {
      {&RC::recomputed_s, false, "recomputing steps done before the fault: checkpoint more often",
       "warm spares"},
      {&RC::start_s, true, "the workers' start: every process was ready", "checkpoint more often"},
      {&RC::start_s, false, "the workers' start: use warm spares (--spare-workers)",
       "checkpoint more often"},
      {&RC::checkpoint_load_s, false, "loading the checkpoint: a smaller checkpoint",
       "checkpoint more often"},
      {&RC::detection_s, false, "noticing the fault: a lower --hang-timeout",
       "checkpoint more often"},
      {&RC::stop_s, false, "stopping the workers", "checkpoint more often"},
      {&RC::rendezvous_s, false, "the rendezvous: a shorter last_call_timeout",
       "checkpoint more often"},
      {&RC::state_from_peer_s, false, "the state transfer from a peer", "checkpoint more often"},
  };
  for (const Case& c : cases) {
    telemetry::JobTelemetry::Snapshot s = Make(Job{});
    RC cost;
    cost.restart = 1;
    cost.detection_s = cost.stop_s = cost.rendezvous_s = 0.5;
    cost.*c.phase = 12;
    s.restart_costs = {cost};
    s.restarts = 1;
    s.lost_s = cost.total_s();
    s.warm_spares = c.spares;
    const auto advice = AdviceLines(telemetry::FormatJobReport(s, 0));
    EXPECT_EQ(Count(advice, c.says), 1) << c.says << ::testing::PrintToString(advice);
    EXPECT_EQ(Count(advice, c.not_says), 0) << c.says << ::testing::PrintToString(advice);
    EXPECT_EQ(Count(advice, "restarts cost more than 10% of the wall time"), 1);
  }
  // The start by how the processes started: cold ones are counted and pointed at the fork
  // server; ready ones (forked, spares) make it the program's own work, whatever the flags said.
  for (const bool cold : {true, false}) {
    telemetry::JobTelemetry::Snapshot s = Make(Job{});
    RC cost;
    cost.restart = 1;
    cost.start_s = 12;
    cost.started_forked = cold ? 1 : 3;
    cost.started_cold = cold ? 2 : 0;
    s.restart_costs = {cost};
    s.restarts = 1;
    s.lost_s = cost.total_s();
    const auto advice = AdviceLines(telemetry::FormatJobReport(s, 0));
    const char* says = cold ? "the workers' start: 2 of 3 process(es) started cold"
                            : "the workers' start: every process was ready (forked from the fork "
                              "server or a promoted spare), so this is the program's own work";
    EXPECT_EQ(Count(advice, says), 1) << ::testing::PrintToString(advice);
    EXPECT_EQ(Count(advice, "use warm spares"), 0) << ::testing::PrintToString(advice);
  }
  // Under 10% of the wall time: no restart advice at all.
  telemetry::JobTelemetry::Snapshot s = Make(Job{});
  s.restarts = 1;
  s.lost_s = 5;
  EXPECT_EQ(Count(AdviceLines(telemetry::FormatJobReport(s, 0)), "restarts cost"), 0);
}

TEST(Advice, LowGpuUseWithRanksWaitingForDataIsDataLoadingAdvice) {
  Job j;
  j.gpu_util = 0.35;
  j.data_wait = 0.4;
  const auto advice = AdviceLines(telemetry::FormatJobReport(Make(j), 0));
  EXPECT_EQ(Count(advice, kDataLine), 1) << ::testing::PrintToString(advice);
  EXPECT_EQ(Count(advice, kOtherLine), 0);
  EXPECT_EQ(Count(advice, "ranks wait for data 40% of a step"), 1);
  EXPECT_EQ(Count(advice, "num_workers"), 1) << "a Python program gets PyTorch's words";
  EXPECT_EQ(Count(advice, "--cpus-per-task"), 1);
  EXPECT_EQ(advice.size(), 1u) << ::testing::PrintToString(advice);
}

TEST(Advice, LowGpuUseWithBusyCpusIsDataLoadingAdviceNamingTrainUnetsFlags) {
  Job j;
  j.gpu_util = 0.35;
  j.cpu_busy = 0.9;
  j.program = "train_unet";
  const auto advice = AdviceLines(telemetry::FormatJobReport(Make(j), 0));
  EXPECT_EQ(Count(advice, kDataLine), 1) << ::testing::PrintToString(advice);
  EXPECT_EQ(Count(advice, "the CPUs are 90% busy"), 1);
  EXPECT_EQ(Count(advice, "--num-data-workers"), 1);
  EXPECT_EQ(Count(advice, "num_workers"), 0);
  EXPECT_EQ(Count(advice, kOtherLine), 0);
}

TEST(Advice, LowGpuUseWithIdleCpusAndNoDataWaitGetsTheOtherCauses) {
  Job j;
  j.gpu_util = 0.35;
  j.cpu_busy = 0.2;
  const auto advice = AdviceLines(telemetry::FormatJobReport(Make(j), 0));
  EXPECT_EQ(Count(advice, kDataLine), 0) << ::testing::PrintToString(advice);
  EXPECT_EQ(Count(advice, kOtherLine), 1);
  EXPECT_EQ(Count(advice, "the CPUs 20% busy"), 1);
  EXPECT_EQ(Count(advice, "GPU memory peaked at 30%: room for more"), 1);
  j.gpu_mem = 0.8;  // a full GPU: no "room for more"
  EXPECT_EQ(Count(AdviceLines(telemetry::FormatJobReport(Make(j), 0)), "room for more"), 0);
}

TEST(Advice, BusyGpusWithFullMemoryGetNoAdvice) {
  Job j;
  j.gpu_util = 0.95;
  j.gpu_mem = 0.99;  // what the notes ask for: the largest batch that fits
  j.data_wait = 0.05;
  const std::string report = telemetry::FormatJobReport(Make(j), 0);
  EXPECT_TRUE(AdviceLines(report).empty()) << report;
  EXPECT_EQ(report.find("would need"), std::string::npos) << report;
}

TEST(Advice, ACpuJobWaitingForDataGetsTheLoaderAdviceOnly) {
  Job j;
  j.data_wait = 0.3;
  auto advice = AdviceLines(telemetry::FormatJobReport(Make(j), 0));
  ASSERT_EQ(advice.size(), 1u) << ::testing::PrintToString(advice);
  EXPECT_EQ(advice[0].rfind("ranks wait for data 30% of a step: more DataLoader workers", 0), 0u)
      << advice[0];
  j.data_wait = 0.05;
  EXPECT_TRUE(AdviceLines(telemetry::FormatJobReport(Make(j), 0)).empty());
}

TEST(Advice, MemoryNearTheRequestNamesTheMeansThatExist) {
  Job j;
  j.rss_fraction = 0.95;
  j.program = "train_unet";
  auto advice = AdviceLines(telemetry::FormatJobReport(Make(j), 0));
  ASSERT_EQ(Count(advice, "memory limit (Slurm --mem)"), 1) << ::testing::PrintToString(advice);
  EXPECT_EQ(Count(advice, "--accumulation-steps, --checkpoint-activations"), 1);
  j.program = "train.py";
  advice = AdviceLines(telemetry::FormatJobReport(Make(j), 0));
  EXPECT_EQ(Count(advice, "gradient accumulation, activation checkpointing"), 1);
  EXPECT_EQ(Count(advice, "--accumulation-steps"), 0);
  j.rss_fraction = 0.5;
  EXPECT_TRUE(AdviceLines(telemetry::FormatJobReport(Make(j), 0)).empty());
}

TEST(Advice, CpuEfficiencyIsAgainstTheCpusAllocatedAsSeffCountsIt) {
  Job j;
  j.cpu_busy = 0.5;
  j.cpus = 8;
  const std::string report = telemetry::FormatJobReport(Make(j), 0);
  // 2 ranks x 200 CPU-s = 400 CPU-s of 8 CPUs x 100 s.
  EXPECT_NE(report.find("CPU efficiency: 50% of 8 CPU(s) allocated (Slurm cpus-per-task) on 1 "
                        "node(s): 400.0 CPU-s of 800.0 s core-walltime; per rank 200% of one core"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("memory on node-a: peak 1.60 GiB of 8.00 GiB (Slurm --mem), 20%"),
            std::string::npos)
      << report;
  auto js = nlohmann::json::parse(telemetry::SnapshotJson(Make(j), false));
  EXPECT_DOUBLE_EQ(js["cpu_efficiency"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(js["cpus_allocated"].get<double>(), 8);
  EXPECT_EQ(js["node_memory"][0]["memory_limit_source"], "Slurm --mem");
}

TEST(Advice, TheSameWorkOnFewerGpusAtNinetyPercent) {
  Job j;
  j.gpu_util = 0.35;
  j.gpus = 71;  // the DGX guide's cluster: 71 GPUs at 35% are 28 at 90%
  const std::string report = telemetry::FormatJobReport(Make(j), 0);
  EXPECT_NE(report.find("this work would need 28 GPU(s) at 90% utilization instead of 71 at 35%"),
            std::string::npos)
      << report;
  EXPECT_EQ(nlohmann::json::parse(telemetry::SnapshotJson(Make(j), false))["gpus_needed_at_90_percent"], 28);
}

// Every flag that train_unet's advice names is one of train_unet's (or the scheduler's).
TEST(Advice, TrainUnetsAdviceNamesOnlyItsOwnFlags) {
  std::ifstream in(std::string(SOURCE_DIR) + "/examples/unet/train_args.cc");
  std::stringstream src;
  src << in.rdbuf();
  ASSERT_FALSE(src.str().empty());
  std::set<std::string> named;
  for (Job j : {Job{.gpu_util = 0.3, .data_wait = 0.5}, Job{.gpu_util = 0.3},
                Job{.data_wait = 0.5, .cpu_busy = 0.9}, Job{.rss_fraction = 0.99}}) {
    j.program = "train_unet";
    for (const std::string& line : AdviceLines(telemetry::FormatJobReport(Make(j), 0))) {
      // Each "--name" (no std::regex: GCC 12 warns inside it under the sanitizer build).
      for (size_t at = line.find("--"); at != std::string::npos; at = line.find("--", at + 2)) {
        size_t end = at + 2;
        while (end < line.size() && (std::islower(line[end]) || std::isdigit(line[end]) || line[end] == '-')) ++end;
        if (end > at + 2) named.insert(line.substr(at, end - at));
      }
    }
  }
  EXPECT_GE(named.size(), 5u);
  for (const std::string& f : named) {
    if (f == "--cpus-per-task" || f == "--mem" || f == "--cpu") continue;  // the schedulers'
    EXPECT_NE(src.str().find("\"" + f + "\""), std::string::npos) << f << " is not train_unet's";
  }
}

}  // namespace
}  // namespace dlrun::rdzv
