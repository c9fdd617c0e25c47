// `dlrun stacks` and the capture before kill with real processes: Python workers in a real Gloo
// job read by the real py-spy (docs/STACKS.md). Each test has its own TMPDIR, so the job index
// (TMPDIR/dlrun-UID/jobs) holds only its own job even when tests run in parallel.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "multiproc/subprocess.h"

namespace dlrun::testing {
namespace {

using nlohmann::json;

const std::string kProbe = std::string(SOURCE_DIR) + "/tests/python/hang_probe.py";

// The line of hang_probe.py that carries `marker` (a comment at its end, or on the line
// before it when the comment ends with ':'), as "hang_probe.py:N".
std::string ProbeLine(const std::string& marker) {
  std::ifstream in(kProbe);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find(marker) == std::string::npos) continue;
    return "hang_probe.py:" + std::to_string(line.back() == ':' ? n + 1 : n);
  }
  ADD_FAILURE() << "no '" << marker << "' in " << kProbe;
  return "";
}

bool HasFrame(const json& frames, const std::string& needle) {
  for (const json& f : frames) {
    if (f.get<std::string>().find(needle) != std::string::npos) return true;
  }
  return false;
}

// Four Gloo ranks; rank 2 sleeps before its 30th all_reduce, the others wait in it.
struct HungJob {
  std::string tmp = MakeTempDir();
  Started job;
  HungJob() {
    job = StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "4", TEST_PYTHON, kProbe},
                       {{"TMPDIR", tmp}});
  }
  ~HungJob() {
    kill(job.pid, SIGTERM);
    FinishCommand(job, std::chrono::seconds(60));
    std::filesystem::remove_all(tmp);
  }
  ProcResult Stacks(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {DLRUN_BIN, "stacks"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunCommand(argv, {{"TMPDIR", tmp}}, std::chrono::seconds(30));
  }
};

TEST(DlrunStacks, TheRankThatStoppedIsTheSuspectAndTheOthersAreGroupedInAllReduce) {
  HungJob h;
  ASSERT_TRUE(ReadUntil(h.job, "hang_probe: rank", 4, std::chrono::seconds(90))) << h.job.output;
  ProcResult r = h.Stacks({"--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["suspects"], json({2})) << r.output;
  EXPECT_TRUE(j["missing"].empty()) << r.output;
  ASSERT_EQ(j["groups"].size(), 2u) << r.output;
  EXPECT_EQ(j["groups"][0]["ranks"], json({2}));  // smallest group first
  EXPECT_TRUE(HasFrame(j["groups"][0]["frames"], ProbeLine("the stalled rank's line")))
      << j["groups"][0].dump();
  EXPECT_EQ(j["groups"][1]["ranks"], json({0, 1, 3}));
  EXPECT_TRUE(HasFrame(j["groups"][1]["frames"], " all_reduce")) << j["groups"][1].dump();
  EXPECT_TRUE(
      HasFrame(j["groups"][1]["frames"], ProbeLine("where the others wait for a stalled rank")))
      << j["groups"][1].dump();
  // The text says the same for people.
  ProcResult text = h.Stacks();
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("suspects: rank 2 "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("ranks 0-1,3 (node "), std::string::npos) << text.output;
}

// A rank stopped with SIGSTOP: py-spy reads it without attaching, so its frames are there; the
// command never waits on it past its bound either way.
TEST(DlrunStacks, ARankStoppedWithSigstopIsReadOrNamedMissingWithinTheBound) {
  HungJob h;
  ASSERT_TRUE(ReadUntil(h.job, "hang_probe: rank", 4, std::chrono::seconds(90))) << h.job.output;
  const json first = json::parse(h.Stacks({"--json"}).output, nullptr, false);
  ASSERT_TRUE(first.is_object());
  int pid = -1;
  for (const json& r : first["ranks"]) {
    if (r["rank"] == 1) pid = r["pid"].get<int>();
  }
  ASSERT_GT(pid, 0) << first.dump();
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  ProcResult r = h.Stacks({"--json", "--timeout", "3"});
  kill(pid, SIGCONT);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.output;
  bool seen = false;
  for (const json& g : j["groups"]) {
    for (const json& rank : g["ranks"]) seen |= rank == 1;
  }
  for (const json& m : j["missing"]) {
    if (m["rank"] == 1) {
      seen = true;
      EXPECT_FALSE(m["why"].get<std::string>().empty());
    }
  }
  EXPECT_TRUE(seen) << r.output;
  EXPECT_LT(j["took_s"].get<double>(), 4.0) << r.output;
}

TEST(DlrunStacks, WithNoJobRunningItIsOneLineAndExitOne) {
  const std::string tmp = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "stacks"}, {{"TMPDIR", tmp}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dlrun: no running dlrun job on this node"), std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  ProcResult bad = RunCommand({DLRUN_BIN, "stacks", "--log-dir", tmp + "/nowhere"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("invalid value '" + tmp + "/nowhere' for --log-dir"),
            std::string::npos) << bad.output;
  std::filesystem::remove_all(tmp);
}

// Capture before kill: rank 2 dies of SIGSEGV while the others wait; the agent dumps the three
// live ones before it stops them, says where they were, and keeps the dump.
TEST(DlrunStacks, ACrashBySegfaultIsCapturedBeforeTheOthersAreStopped) {
  const std::string tmp = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "4", "--report-json",
                             tmp + "/report.json", TEST_PYTHON, kProbe},
                            {{"TMPDIR", tmp}, {"HANG_KIND", "segv"}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("rank 2 got SIGSEGV; the other 3 ranks were in wait_for_peer at " +
                          ProbeLine("where the others wait for a crashed rank")),
            std::string::npos) << r.output;
  std::ifstream in(tmp + "/report.json");
  const json report = json::parse(in, nullptr, false);
  ASSERT_TRUE(report.is_object()) << r.output;
  const json& f = report["failures"][0];
  EXPECT_EQ(f["class"], "segfault");
  EXPECT_EQ(f["rank"], 2);
  EXPECT_EQ(f["stacks"]["groups"][0]["ranks"], json({0, 1, 3})) << f.dump();
  // The dump is kept beside the error files, in the attempt's directory.
  bool kept = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp)) {
    kept |= e.path().filename() == "stacks.txt";
  }
  EXPECT_TRUE(kept) << r.output;
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace dlrun::testing
