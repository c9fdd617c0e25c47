// Job telemetry end to end (docs/TELEMETRY.md): a rank slowed from outside by SIGSTOP/SIGCONT
// pulses is named a straggler within 10 windows, a balanced run names nobody, and GPU figures
// come through NVML (the fake library: no GPU here).
#include <unistd.h>

#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

constexpr auto kTelemetryDeadline = std::chrono::seconds(120);

std::map<std::string, std::string> PythonEnv() {
  return {{"PYTHON_EXEC", TEST_PYTHON},
          {"PYTHONPATH", std::string(SOURCE_DIR) + "/python"},
          {"OMP_NUM_THREADS", "1"}};
}

// Runs the probe with 4 ranks for 12 s, 80 ms of "compute" a step (long against scheduling
// jitter on a loaded machine, so a balanced run stays balanced); with `pulse_rank` >= 0 that
// rank is stopped and continued (60 ms each) from this test until the job ends. Returns the
// report.
nlohmann::json RunProbe(int pulse_rank, std::string* output) {
  const std::string dir = MakeTempDir();
  Started s = StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "4", "--report-json",
                            dir + "/report.json", std::string(SOURCE_DIR) +
                            "/tests/python/straggler_probe.py", "12", "0.08"},
                           PythonEnv());
  EXPECT_TRUE(ReadUntil(s, "ready ", 4, kTelemetryDeadline)) << s.output;
  int pid = -1;
  for (absl::string_view line : absl::StrSplit(s.output, '\n')) {
    const std::string prefix = "[rank " + std::to_string(pulse_rank) + "]: ready ";
    if (absl::StartsWith(line, prefix)) {
      EXPECT_TRUE(absl::SimpleAtoi(line.substr(prefix.size()), &pid));
    }
  }
  std::atomic<bool> done{false};
  std::thread pulses;
  if (pulse_rank >= 0) {
    EXPECT_GT(pid, 0) << s.output;
    pulses = std::thread([&] {
      while (!done) {  // a duty cycle on the rank, not a wait for state
        kill(pid, SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(60));
        kill(pid, SIGCONT);
        std::this_thread::sleep_for(std::chrono::milliseconds(60));
      }
    });
  }
  const int rc = FinishCommand(s, kTelemetryDeadline);
  done = true;
  if (pulses.joinable()) pulses.join();
  if (pid > 0) kill(pid, SIGCONT);
  *output = s.output;
  EXPECT_EQ(rc, 0) << s.output;
  return nlohmann::json::parse(ReadFile(dir + "/report.json"));
}

TEST(DlrunTelemetry, ARankSlowedFromOutsideIsNamedWithinTenWindows) {
  std::string out;
  const nlohmann::json j = RunProbe(2, &out);
  ASSERT_EQ(j["stragglers"].size(), 1u) << j.dump(2) << out;
  const auto& st = j["stragglers"][0];
  EXPECT_EQ(st["rank"], 2);
  EXPECT_EQ(st["metric"], "compute");
  EXPECT_GT(st["value"].get<double>(), 1.2 * st["median"].get<double>());
  const int64_t first = j["job"]["first_step_window"].get<int64_t>();
  ASSERT_GE(first, 0);
  EXPECT_LE(st["window"].get<int64_t>() - first, 10) << j.dump(2);
  EXPECT_NE(out.find("straggler: rank 2 on "), std::string::npos) << out;
  EXPECT_NE(out.find("advice: rank 2 on "), std::string::npos) << out;
  // The report's figures agree with what the ranks reported: everyone stepped alike.
  const int64_t steps = j["ranks"]["0"]["steps"].get<int64_t>();
  EXPECT_GT(steps, 20);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(j["ranks"][std::to_string(r)]["steps"], steps);
  EXPECT_GT(j["ranks"]["2"]["compute_s_per_step"].get<double>(),
            j["ranks"]["0"]["compute_s_per_step"].get<double>());
  EXPECT_LT(j["ranks"]["2"]["sync_wait_s_per_step"].get<double>(),
            j["ranks"]["0"]["sync_wait_s_per_step"].get<double>());
}

TEST(DlrunTelemetry, ABalancedRunNamesNobody) {
  std::string out;
  const nlohmann::json j = RunProbe(-1, &out);
  EXPECT_TRUE(j["stragglers"].empty()) << j.dump(2);
  EXPECT_EQ(out.find("straggler:"), std::string::npos) << out;
  EXPECT_GT(j["job"]["windows"].get<int64_t>() - j["job"]["first_step_window"].get<int64_t>(), 8)
      << "long enough to have named one";
  for (int r = 0; r < 4; ++r) {
    const auto& x = j["ranks"][std::to_string(r)];
    EXPECT_FALSE(x["cpu_utilization"].is_null()) << "sampled from /proc";
    EXPECT_GT(x["rss_peak_bytes"].get<int64_t>(), 10 << 20) << "python with torch";
  }
}

// A Python program whose one DataLoader worker process is the bottleneck, timed by
// dlrun_report.timed(loader, report=True): the rank waits for data over half of its steps,
// and the report's advice is about the loader, in PyTorch's words.
TEST(DlrunTelemetry, ASlowDataLoaderIsTimedAndGetsTheLoaderAdvice) {
  const std::string dir = MakeTempDir();
  // One rank: with two, the rank whose batch comes first waits for the other in the gradient
  // all-reduce, and the wait shows as its sync, not its data wait.
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "1", "--report-json", dir + "/r.json",
       std::string(SOURCE_DIR) + "/tests/python/slow_loader.py", "12", "0.05"},
      PythonEnv(), kTelemetryDeadline);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(ReadFile(dir + "/r.json"));
  EXPECT_EQ(j["program"], "slow_loader.py");
  for (const char* rank : {"0"}) {
    const auto& x = j["ranks"][rank];
    EXPECT_EQ(x["steps"], 12) << x.dump();
    EXPECT_EQ(x["samples"], 24) << x.dump();
    ASSERT_FALSE(x["data_wait_fraction"].is_null()) << x.dump();
    EXPECT_GT(x["data_wait_fraction"].get<double>(), 0.5) << x.dump();
    // The loader process' CPU (12 batches x 2 samples x 50 ms) is the rank's.
    EXPECT_GT(x["cpu_seconds"].get<double>(), 1.2) << x.dump();
  }
  EXPECT_NE(r.output.find("advice: ranks wait for data "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("more DataLoader workers (num_workers)"), std::string::npos) << r.output;
}

// `import dlrun`: under dlrun from the helper directory it puts on the workers' PYTHONPATH,
// and outside it from the project's virtual environment (scripts/install-deps installs it).
TEST(DlrunTelemetry, ThePythonHelperImportsAsAPackage) {
  const std::string probe = std::string(SOURCE_DIR) + "/tests/python/import_probe.py";
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "1", probe},
                            {{"PYTHON_EXEC", TEST_PYTHON}}, kTelemetryDeadline);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dlrun from " + std::string(BUILD_SHARE_DIR) + "/python/dlrun/__init__.py"),
            std::string::npos)
      << r.output;
  r = RunCommand({"env", "-u", "PYTHONPATH", TEST_PYTHON, probe}, {}, kTelemetryDeadline);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("/site-packages/dlrun/__init__.py"), std::string::npos) << r.output;
}

TEST(DlrunTelemetry, GpuFiguresComeThroughNvml) {
  const std::string dir = MakeTempDir();
  const std::string procs = dir + "/procs";
  { std::ofstream(procs) << ""; }
  // Each worker puts itself on GPU 0 with 3000 MiB (the fake reads the file at each call), then
  // stays until the agent has sampled it twice (so one sample is complete; 20 s at most).
  const std::string seen = dir + "/seen";
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--report-json", dir + "/r.json", "bash",
       "-c",
       "echo \"0:$$:3000\" >> " + procs +
           "; for i in 1 2 3; do printf 'S %d 1 0.5\\n' $i >&$DLRUN_HEARTBEAT_FD; done; "
           "for i in $(seq 2000); do [ \"$(grep -c \"^$$\\$\" " + seen +
           " 2>/dev/null)\" -ge 2 ] && break; sleep 0.01; done"},
      {{"DLRUN_NVML_LIBRARY", FAKE_NVML_LIB},
       {"FAKE_NVML_GPUS", "15000:16000:40,1000:16000:80"},
       {"FAKE_NVML_PROCS_FILE", procs},
       {"FAKE_NVML_SEEN_FILE", seen}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(ReadFile(dir + "/r.json"));
  ASSERT_EQ(j["gpus"].size(), 2u) << j.dump(2);
  EXPECT_NEAR(j["gpus"][0]["utilization"].get<double>(), 0.4, 1e-6);
  EXPECT_EQ(j["gpus"][1]["memory_used_bytes"], int64_t{1000} << 20);
  EXPECT_EQ(j["ranks"]["0"]["gpu_memory_bytes"], int64_t{3000} << 20);
  EXPECT_EQ(j["ranks"]["1"]["gpu_memory_bytes"], int64_t{3000} << 20);
  EXPECT_NE(r.output.find("GPU utilization: mean 60%, min 40% over 2 GPU(s)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("GPU memory is near its limit"), std::string::npos) << r.output;
  // Two GPUs at a mean of 60%: the same work fits on 2 at 90% (no fewer), so no such line; the
  // low use with idle CPUs and no data records gets the other causes.
  EXPECT_EQ(r.output.find("would need"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("advice: GPU utilization is 60% with little data wait"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("CPU efficiency: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" CPU(s) allocated ("), std::string::npos) << r.output;
}

// The restart ledger (docs/TELEMETRY.md, "Time lost to restarts"): rank 1 of a 2-rank gloo job
// exits before step 13 of its first attempt; the group resumes from the checkpoint of step 10
// and computes steps 11 and 12 again. The report's restart has every phase, summing to its
// total, the two steps, and the resume the program sent; goodput is kept steps over the wall.
TEST(DlrunTelemetry, ARestartsCostIsSplitIntoPhasesWithTheStepsComputedAgain) {
  const std::string dir = MakeTempDir();
  auto env = PythonEnv();
  env["CRASH_RANK"] = "1";
  env["CRASH_STEP"] = "13";
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--max-restarts",
                             "1", "--report-json", dir + "/r.json", TEST_PYTHON,
                             std::string(SOURCE_DIR) + "/tests/python/lost_time_train.py", "20",
                             "10", dir + "/ckpt", "0.05"},
                            env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(ReadFile(dir + "/r.json"));
  ASSERT_EQ(j["lost"]["restarts"].size(), 1u) << j.dump(2);
  const auto& c = j["lost"]["restarts"][0];
  EXPECT_EQ(c["restart"], 1);
  EXPECT_EQ(c["fault_step"], 12);
  EXPECT_EQ(c["resumed_step"], 10);
  EXPECT_EQ(c["recomputed_steps"], 2);
  EXPECT_TRUE(c["resumed"].get<bool>());
  double sum = 0;
  for (const char* phase : {"detection_s", "stop_s", "rendezvous_s", "start_s",
                            "checkpoint_load_s", "recomputed_s"}) {
    EXPECT_GE(c[phase].get<double>(), 0) << phase;
    sum += c[phase].get<double>();
  }
  EXPECT_NEAR(sum, c["total_s"].get<double>(), 1e-6);
  // What the ledger promises, not how fast this machine is: a start phase counted (a warm
  // spare's start may take 0.03 s), and the two steps computed again (0.05 s each, measured
  // from the records' arrival, which jitters: more than one and a half steps).
  EXPECT_GT(c["start_s"].get<double>(), 0) << "the replacement's start";
  EXPECT_GT(c["recomputed_s"].get<double>(), 0.075) << "two steps of 0.05 s";
  EXPECT_NEAR(j["lost"]["total_s"].get<double>(), c["total_s"].get<double>(), 1e-9);
  EXPECT_GT(c["total_s"].get<double>(), c["recomputed_s"].get<double>()) << "and the start";
  const double goodput = j["goodput"].get<double>();
  EXPECT_GT(goodput, 0);
  EXPECT_LT(goodput, 1);
  EXPECT_NEAR(goodput * j["wall_s"].get<double>(), j["productive_s"].get<double>(), 1e-6);
  EXPECT_GT(j["productive_s"].get<double>(), 0.9 * 20 * 0.05)
      << "20 kept steps of at least 0.05 s (less the records' jitter)";
  EXPECT_NE(r.output.find("2 step(s) recomputed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(resumed from step 10)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dlrun::testing

namespace dlrun::testing {
namespace {

// `dlrun rdzv-server --metrics-port`: the stand-alone server aggregates and serves the job's
// telemetry, and prints the job's report when it ends.
TEST(DlrunTelemetry, RdzvServerServesTheJobsMetricsAndReport) {
  const std::string dir = MakeTempDir();
  const int port = FreeTcpPort();
  const std::map<std::string, std::string> env = {{"DLRUN_RDZV_TOKEN", "server-token"}};
  Started server = StartCommand({DLRUN_BIN, "rdzv-server", "--host", "127.0.0.1", "--port",
                                 std::to_string(port), "--nnodes", "2", "--run-id", "srv",
                                 "--metrics-port", "0", "--metrics-addr", "127.0.0.1"},
                                env);
  ASSERT_TRUE(ReadUntil(server, "job telemetry on http://127.0.0.1:", 1, kTelemetryDeadline))
      << server.output;
  int metrics_port = 0;
  {
    const size_t at = server.output.find("job telemetry on http://127.0.0.1:");
    const std::string rest = server.output.substr(at + 34);
    ASSERT_TRUE(absl::SimpleAtoi(rest.substr(0, rest.find('/')), &metrics_port)) << rest;
  }
  // Two agents (not hosting), 2 workers each, stepping until the stop file exists.
  const std::string stop = dir + "/stop";
  const std::string worker =
      "i=0; while [ ! -e " + stop +
      " ]; do i=$((i+1)); printf 'S %d 2 0.05 loss=1\\n' $i >&$DLRUN_HEARTBEAT_FD; sleep 0.05; done";
  std::vector<Started> agents;
  for (int n = 0; n < 2; ++n) {
    agents.push_back(StartCommand(
        {DLRUN_BIN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port), "--rdzv-id", "srv",
         "--rdzv-conf", "is_host=false", "bash", "-c", worker},
        env));
  }
  // Wait for the event: every rank's series at /metrics (fetched with python's urllib).
  const std::string fetch =
      "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("
      "'http://127.0.0.1:" + std::to_string(metrics_port) + "/metrics', timeout=5).read().decode())";
  std::string metrics;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    metrics = RunCommand({TEST_PYTHON, "-c", fetch}).output;
    if (metrics.find("dlrun_steps{rank=\"3\"}") != std::string::npos &&
        metrics.find("dlrun_world_size 4") != std::string::npos) {
      break;
    }
  }
  { std::ofstream(stop) << ""; }
  for (Started& a : agents) EXPECT_EQ(FinishCommand(a, kTelemetryDeadline), 0) << a.output;
  EXPECT_EQ(FinishCommand(server, kTelemetryDeadline), 0) << server.output;
  EXPECT_NE(metrics.find("dlrun_steps{rank=\"3\"}"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dlrun_world_size 4"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dlrun_nodes 2"), std::string::npos) << metrics;
  EXPECT_NE(server.output.find("job report: succeeded"), std::string::npos) << server.output;
  EXPECT_NE(server.output.find("4 rank(s) on 2 node(s)"), std::string::npos) << server.output;
}

// Served on every address (the default --metrics-addr), the line names this host, as a browser
// on another machine would reach it.
TEST(DlrunTelemetry, TheMetricsLineNamesThisHost) {
  char name[256] = {0};
  ASSERT_EQ(gethostname(name, sizeof name - 1), 0);
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--metrics-port", "0", "/bin/true"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(std::string("job telemetry on http://") + name + ":"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace dlrun::testing
