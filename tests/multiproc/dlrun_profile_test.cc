// --profile with real processes (docs/PROFILING.md): the real py-spy on a 2-rank Gloo job, the
// PyTorch profiler through dlrun_report, nsys through a stub that records its command line (nsys
// cannot be installed here), and a missing tool. perf on train_unet is in train_unet_test.
#include <signal.h>

#include <filesystem>
#include <regex>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

using nlohmann::json;

const std::string kProfileProbe = std::string(SOURCE_DIR) + "/tests/python/profile_probe.py";

// "profile_probe: rank R cmdline=[...] parent=P profile=T" of rank `rank`, without the prefix.
std::string ProbeLine(const std::string& output, int rank) {
  const std::string key = "profile_probe: rank " + std::to_string(rank) + " ";
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    const size_t at = line.find(key);
    if (at != absl::string_view::npos) return std::string(line.substr(at + key.size()));
  }
  return "";
}

json ReadJson(const std::string& path) {
  return json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
}

struct Job {
  std::string tmp = MakeTempDir();
  std::string logs = tmp + "/logs";
  std::string report = tmp + "/report.json";
  ProcResult Run(std::vector<std::string> flags, std::vector<std::string> program,
                 std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {DLRUN_BIN, "--standalone", "--log-dir", logs,
                                     "--report-json", report};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), program.begin(), program.end());
    env.emplace("TMPDIR", tmp);
    return RunCommand(argv, env, std::chrono::seconds(150));
  }
  ~Job() { std::filesystem::remove_all(tmp); }
};

TEST(DlrunProfile, PySpyProfilesOnlyTheListedRankAndItsFlameGraphNamesTheHotFunction) {
  Job j;
  // Steps 5-30 only: the import of torch before them would take most of a whole run's samples.
  ProcResult r = j.Run({"--nproc-per-node", "2", "--profile", "py-spy", "--profile-ranks", "1",
                        "--profile-steps", "5:30"},
                       {TEST_PYTHON, kProfileProbe, "40"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json rep = ReadJson(j.report);
  ASSERT_TRUE(rep.is_object()) << r.output;
  ASSERT_EQ(rep["profiles"].size(), 1u) << rep["profiles"].dump();
  const std::string svg_path = rep["profiles"]["1"].get<std::string>();
  EXPECT_TRUE(absl::EndsWith(svg_path, "/profile/rank1.svg")) << svg_path;
  const std::string svg = ReadFile(svg_path);
  EXPECT_TRUE(absl::StrContains(svg, "<title>hot_function (profile_probe.py:")) << svg.substr(0, 2000);
  const json& d = rep["profile_details"][0];
  ASSERT_FALSE(d["hot"].empty()) << d.dump();
  EXPECT_EQ(d["hot"][0]["frame"], "hot_function (profile_probe.py)") << d.dump();
  EXPECT_GT(d["hot"][0]["fraction"].get<double>(), 0.5) << d.dump();
  EXPECT_TRUE(std::regex_search(r.output, std::regex("rank 1 \\([0-9]+ samples\\): ")))
      << "the report names the hot frames, with the samples they are shares of";
  EXPECT_TRUE(absl::StrContains(r.output, "% in hot_function (profile_probe.py)")) << r.output;
  // Rank 0 is as without --profile; rank 1 too (py-spy attaches): the same command line, both
  // children of dlrun itself, and no profiling variable in rank 0.
  const std::string r0 = ProbeLine(r.output, 0), r1 = ProbeLine(r.output, 1);
  ASSERT_FALSE(r0.empty()) << r.output;
  EXPECT_TRUE(absl::StrContains(r0, "parent=dlrun profile=none")) << r0;
  EXPECT_TRUE(absl::StrContains(r1, "parent=dlrun profile=py-spy")) << r1;
  EXPECT_EQ(r0.substr(0, r0.find(" parent=")), r1.substr(0, r1.find(" parent="))) << r0 << "\n" << r1;
  std::error_code ec;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(svg_path).parent_path() / "rank0.svg",
                                       ec));
}

// What does not profile says so: a listed rank the job does not have, and a step range for a
// program that sends no step records (its window never opens).
TEST(DlrunProfile, RanksTheJobDoesNotHaveAndAStepRangeWithoutStepRecordsAreSaid) {
  Job j;
  ProcResult r = j.Run({"--nproc-per-node", "2", "--profile", "py-spy", "--profile-ranks", "0,5",
                        "--profile-steps", "2:3"},
                       {TEST_PYTHON, "-c", "import time; time.sleep(1)"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Count(r.output, "--profile-ranks: the job has ranks 0-1 (world size 2): rank 5 is "
                            "not profiled"),
            1u)
      << r.output;
  const json rep = ReadJson(j.report);
  ASSERT_TRUE(rep.is_object()) << r.output;
  ASSERT_EQ(rep["profile_details"].size(), 1u) << rep.dump();
  EXPECT_TRUE(absl::StrContains(rep["profile_details"][0]["note"].get<std::string>(),
                                "no capture: --profile-steps 2:3 counts step records and rank 0 "
                                "sent none"))
      << rep["profile_details"].dump();
}

TEST(DlrunProfile, TheTorchProfilerTracesTheStepRangeOfTheListedRank) {
  Job j;
  ProcResult r = j.Run({"--nproc-per-node", "2", "--profile", "torch", "--profile-ranks", "0",
                        "--profile-steps", "3:5"},
                       {TEST_PYTHON, kProfileProbe, "8"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json rep = ReadJson(j.report);
  ASSERT_EQ(rep["profiles"].size(), 1u) << r.output;
  const std::string path = rep["profiles"]["0"].get<std::string>();
  EXPECT_TRUE(absl::EndsWith(path, "/profile/rank0.pt.trace.json")) << path;
  const json trace = ReadJson(path);
  ASSERT_TRUE(trace.is_object()) << path;
  // Three steps' all_reduce calls, recorded by the profiler's CPU activity.
  int all_reduces = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e.value("name", "").find("all_reduce") != std::string::npos && e.value("ph", "") == "X") {
      ++all_reduces;
    }
  }
  EXPECT_GE(all_reduces, 3) << "steps 3-5";
  EXPECT_LE(all_reduces, 6) << "only steps 3-5, not all 8";
  EXPECT_TRUE(absl::StrContains(ProbeLine(r.output, 1), "profile=none"));
}

TEST(DlrunProfile, NsysWrapsExactlyTheListedRanksWithTheDocumentedCommandLine) {
  Job j;
  const std::string log = j.tmp + "/nsys.log";
  ProcResult r = j.Run({"--nproc-per-node", "3", "--profile", "nsys", "--profile-ranks", "0,2",
                        "--profile-steps", "2:4", "--profile-args", "--trace cuda,nvtx"},
                       {TEST_PYTHON, kProfileProbe, "6"},
                       {{"DLRUN_NSYS", std::string(SOURCE_DIR) + "/tests/multiproc/nsys_stub.sh"},
                        {"NSYS_STUB_LOG", log}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> calls = absl::StrSplit(ReadFile(log), '\n', absl::SkipEmpty());
  std::sort(calls.begin(), calls.end());
  ASSERT_EQ(calls.size(), 2u) << ReadFile(log);
  const json rep = ReadJson(j.report);
  for (int i = 0; i < 2; ++i) {
    const int rank = i * 2;
    const std::string stem = std::filesystem::path(rep["profiles"][std::to_string(rank)].get<std::string>())
                                 .replace_extension("").string();
    EXPECT_EQ(calls[i], "RANK=" + std::to_string(rank) + " DLRUN_PROFILE_STEPS=2:4 profile -o " +
                            stem +
                            " --force-overwrite true --capture-range=cudaProfilerApi "
                            "--capture-range-end=stop --trace cuda,nvtx -- " + TEST_PYTHON + " " +
                            kProfileProbe + " 6");
  }
  EXPECT_TRUE(absl::StrContains(ProbeLine(r.output, 1), "profile=none"));
  EXPECT_TRUE(absl::StrContains(ProbeLine(r.output, 2), "profile=nsys"));
}

TEST(DlrunProfile, AMissingToolIsOneLineAndNoWorkerStarts) {
  Job j;
  const std::string marker = j.tmp + "/started";
  ProcResult r = j.Run({"--nproc-per-node", "2", "--profile", "nsys", "--profile-ranks", "0"},
                       {TEST_PYTHON, kProfileProbe, "2", marker}, {{"PATH", "/usr/bin:/bin"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "dlrun: --profile nsys: nsys is not installed (NVIDIA Nsight Systems, the "
                      "nsight-systems package of NVIDIA's CUDA repository; or set DLRUN_NSYS)\n");
  std::error_code ec;
  EXPECT_FALSE(std::filesystem::exists(marker, ec)) << "no worker started";
  r = j.Run({"--profile", "perf", "--profile-ranks", "0"},
            {TEST_PYTHON, kProfileProbe, "2", marker}, {{"DLRUN_PERF", "/nonexistent/perf"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(absl::StartsWith(r.output, "dlrun: --profile perf: perf is not installed (Debian: "
                                         "apt install linux-perf"))
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(marker, ec));
}

// `dlrun profile` on a running job of two agents on loopback (one rank each): the request goes
// through the rendezvous to the node that runs the rank, whose agent attaches py-spy for the
// duration; the answer names that node's flame graph and its hot frames.
TEST(DlrunProfile, LiveOnAJobOfTwoAgentsProfilesTheRankOnTheNodeThatRunsIt) {
  const std::string tmp_a = MakeTempDir(), tmp_b = MakeTempDir();
  const std::string ep = "127.0.0.1:" + std::to_string(FreeTcpPort());
  const std::vector<std::string> cmd = {DLRUN_BIN,
                                        "--nnodes",
                                        "2",
                                        "--nproc-per-node",
                                        "1",
                                        "--rdzv-backend",
                                        "c10d",
                                        "--rdzv-endpoint",
                                        ep,
                                        "--rdzv-id",
                                        "profile-job",
                                        "--rdzv-conf",
                                        "heartbeat_interval=0.5",
                                        "--metrics-port",
                                        "0",
                                        "--metrics-addr",
                                        "127.0.0.1",
                                        TEST_PYTHON,
                                        kProfileProbe,
                                        "1000000"};
  const std::map<std::string, std::string> token = {{"DLRUN_RDZV_TOKEN", "profile-test-token"}};
  auto env = [&](const std::string& tmp) {
    auto e = token;
    e.emplace("TMPDIR", tmp);
    return e;
  };
  Started a, b;
  // Both agents stop when the test ends, also after a failed ASSERT (their job runs for hours).
  struct StopJobs {
    std::vector<Started*> jobs;
    std::vector<std::string> dirs;
    ~StopJobs() {
      for (Started* j : jobs) {
        if (j->pid > 0) kill(j->pid, SIGTERM);
      }
      for (Started* j : jobs) {
        if (j->pid > 0) FinishCommand(*j, std::chrono::seconds(60));
      }
      for (const std::string& d : dirs) std::filesystem::remove_all(d);
    }
  } stop{{&a, &b}, {tmp_a, tmp_b}};
  a = StartCommand(cmd, env(tmp_a));
  ASSERT_TRUE(ReadUntil(a, "hosting the rendezvous", 1, std::chrono::seconds(60))) << a.output;
  b = StartCommand(cmd, env(tmp_b));
  ASSERT_TRUE(ReadUntil(a, "profile_probe: rank", 1, std::chrono::seconds(90))) << a.output;
  ASSERT_TRUE(ReadUntil(b, "profile_probe: rank", 1, std::chrono::seconds(90))) << b.output;
  // Asked on node a, whichever node runs rank 1.
  ProcResult r = RunCommand({DLRUN_BIN, "profile", "--ranks", "1", "--duration", "2s", "--tool",
                             "py-spy", "--json"},
                            env(tmp_a), std::chrono::seconds(120));
  // The agents' lines too: a call the host cancelled (once under load in CI) says why there.
  if (r.exit_code != 0) {
    ReadUntil(a, "(the agents' lines so far)", 1, std::chrono::seconds(2));
    ReadUntil(b, "(the agents' lines so far)", 1, std::chrono::seconds(2));
  }
  ASSERT_EQ(r.exit_code, 0) << r.output << "\nnode a:\n" << a.output << "\nnode b:\n" << b.output;
  const json j = json::parse(r.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.output;
  ASSERT_EQ(j["profiles"].size(), 1u) << r.output;
  const std::string svg = j["profiles"]["1"].get<std::string>();
  EXPECT_NE(ReadFile(svg).find("hot_function"), std::string::npos) << svg;
  ASSERT_EQ(j["profile_details"].size(), 1u) << r.output;
  const json& d = j["profile_details"][0];
  EXPECT_EQ(d["tool"], "py-spy");
  EXPECT_FALSE(d["host"].get<std::string>().empty());
  ASSERT_FALSE(d["hot"].empty()) << r.output;
  EXPECT_NE(d["hot"][0]["frame"].get<std::string>().find("hot_function"), std::string::npos)
      << r.output;
  // The file lies in the run directory of the agent that runs rank 1: under its TMPDIR.
  const std::string rank1_tmp = ProbeLine(a.output, 1).empty() ? tmp_b : tmp_a;
  EXPECT_EQ(svg.rfind(rank1_tmp, 0), 0u) << svg;
  EXPECT_TRUE(j["notes"].empty()) << r.output;

  // The live page (served by the rendezvous host, node a) lists it and serves the flame graph.
  ASSERT_TRUE(ReadUntil(a, "job telemetry on http://127.0.0.1:", 1, std::chrono::seconds(5)))
      << a.output;
  const size_t at = a.output.find("job telemetry on http://127.0.0.1:") + 34;
  const std::string base = "http://127.0.0.1:" + a.output.substr(at, a.output.find('/', at) - at);
  auto fetch = [&](const std::string& path) {
    return RunCommand({TEST_PYTHON, "-c",
                       "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen('" +
                           base + path + "', timeout=5).read().decode())"})
        .output;
  };
  json details;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (details.empty() && std::chrono::steady_clock::now() < deadline) {
    const json job = json::parse(fetch("/api/job"), nullptr, false);
    if (job.is_object() && job.contains("profiles") && job["profiles"].contains("1")) {
      details = job["profile_details"];
    }
  }
  ASSERT_EQ(details.size(), 1u) << "rank 1's profile never reached /api/job";
  EXPECT_EQ(details[0]["path"], svg);
  EXPECT_NE(fetch("/profile/1").find("hot_function"), std::string::npos);
  EXPECT_NE(fetch("/profile/0").find("404"), std::string::npos) << "rank 0 has none";
  if (RunCommand({"sh", "-c", "command -v chromium"}).exit_code == 0) {
    const std::string page =
        RunCommand({"timeout", "60", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--user-data-dir=" + tmp_a + "/chromium",
                    "--virtual-time-budget=4000", "--dump-dom", base + "/"})
            .output;
    EXPECT_NE(page.find("<a href=\"profile/1\""), std::string::npos) << page;
    EXPECT_NE(page.find("% in hot_function"), std::string::npos) << page;
  } else {
    ADD_FAILURE() << "chromium is missing (scripts/install-deps --system): the page is unchecked";
  }

  // nsys cannot attach: one line, exit 2; a rank the job does not have is named.
  r = RunCommand({DLRUN_BIN, "profile", "--ranks", "0", "--tool", "nsys"}, env(tmp_a));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "dlrun: nsys cannot attach to a running process: dlrun profile runs py-spy "
                      "or perf; for nsys, start the job with --profile nsys --profile-ranks\n");
  r = RunCommand({DLRUN_BIN, "profile", "--ranks", "7", "--duration", "1s"}, env(tmp_b),
                 std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("rank 7: no live worker of the job has it"), std::string::npos)
      << r.output;
}

// `dlrun profile` on a single-node job: the command attaches py-spy itself, from the job's
// workers file, and the run directory is kept after the job for the file.
TEST(DlrunProfile, LiveOnASingleNodeJobAttachesFromTheWorkersFile) {
  Job j;
  Started job = StartCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", TEST_PYTHON, kProfileProbe, "1000000"},
      {{"TMPDIR", j.tmp}});
  struct StopJob {
    Started* job;
    ~StopJob() {
      if (job->pid > 0) kill(job->pid, SIGTERM);
      if (job->pid > 0) FinishCommand(*job, std::chrono::seconds(60));
    }
  } stop{&job};
  ASSERT_TRUE(ReadUntil(job, "profile_probe: rank", 2, std::chrono::seconds(90))) << job.output;
  ProcResult r = RunCommand({DLRUN_BIN, "profile", "--ranks", "0", "--duration", "1500ms"},
                            {{"TMPDIR", j.tmp}}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // "profile of rank 0 (py-spy on HOST): PATH.svg" (no std::regex: GCC 12 warns inside it
  // under the sanitizer build's flags).
  const std::string head = "profile of rank 0 (py-spy on ";
  const size_t at = r.output.find(head);
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t colon = r.output.find("): ", at);
  ASSERT_NE(colon, std::string::npos) << r.output;
  const std::string svg = r.output.substr(colon + 3, r.output.find('\n', colon) - colon - 3);
  ASSERT_TRUE(absl::EndsWith(svg, ".svg")) << r.output;
  EXPECT_NE(ReadFile(svg).find("hot_function"), std::string::npos) << svg;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("  rank 0 \\([0-9]+ samples\\): ")))
      << "the hot frames: " << r.output;
  EXPECT_EQ(r.output.find("profile of rank 1"), std::string::npos) << r.output;
  kill(job.pid, SIGTERM);
  FinishCommand(job, std::chrono::seconds(60));
  job.pid = -1;
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::exists(svg, ec)) << "kept after the job: " << job.output;
}

}  // namespace
}  // namespace dlrun::testing
