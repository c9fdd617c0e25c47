// --profile with real processes (docs/PROFILING.md): the real py-spy on a 2-rank Gloo job, the
// PyTorch profiler through dlrun_report, nsys through a stub that records its command line (nsys
// cannot be installed here), and a missing tool. perf on train_unet is in train_unet_test.
#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"

namespace dlrun::testing {
namespace {

using nlohmann::json;

const std::string kProbe = std::string(SOURCE_DIR) + "/tests/python/profile_probe.py";

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
                       {TEST_PYTHON, kProbe, "40"});
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
  EXPECT_TRUE(absl::StrContains(r.output, "rank 1: ")) << "the report names the hot frames";
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

TEST(DlrunProfile, TheTorchProfilerTracesTheStepRangeOfTheListedRank) {
  Job j;
  ProcResult r = j.Run({"--nproc-per-node", "2", "--profile", "torch", "--profile-ranks", "0",
                        "--profile-steps", "3:5"},
                       {TEST_PYTHON, kProbe, "8"});
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
                       {TEST_PYTHON, kProbe, "6"},
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
                            stem + " --force-overwrite true --capture-range=cudaProfilerApi "
                            "--capture-range-end=stop --trace cuda,nvtx -- " TEST_PYTHON " " +
                            kProbe + " 6");
  }
  EXPECT_TRUE(absl::StrContains(ProbeLine(r.output, 1), "profile=none"));
  EXPECT_TRUE(absl::StrContains(ProbeLine(r.output, 2), "profile=nsys"));
}

TEST(DlrunProfile, AMissingToolIsOneLineAndNoWorkerStarts) {
  Job j;
  const std::string marker = j.tmp + "/started";
  ProcResult r = j.Run({"--nproc-per-node", "2", "--profile", "nsys", "--profile-ranks", "0"},
                       {TEST_PYTHON, kProbe, "2", marker}, {{"PATH", "/usr/bin:/bin"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "dlrun: --profile nsys: nsys is not installed (NVIDIA Nsight Systems, the "
                      "nsight-systems package of NVIDIA's CUDA repository; or set DLRUN_NSYS)\n");
  std::error_code ec;
  EXPECT_FALSE(std::filesystem::exists(marker, ec)) << "no worker started";
  r = j.Run({"--profile", "perf", "--profile-ranks", "0"}, {TEST_PYTHON, kProbe, "2", marker},
            {{"DLRUN_PERF", "/nonexistent/perf"}});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(absl::StartsWith(r.output, "dlrun: --profile perf: perf is not installed (Debian: "
                                         "apt install linux-perf"))
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(marker, ec));
}

}  // namespace
}  // namespace dlrun::testing
