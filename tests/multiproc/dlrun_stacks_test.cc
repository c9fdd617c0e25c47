// `dlrun stacks` and the capture before kill with real processes: Python workers in a real Gloo
// job read by the real py-spy (docs/STACKS.md). Each test has its own TMPDIR, so the job index
// (TMPDIR/dlrun-UID/jobs) holds only its own job even when tests run in parallel.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "multiproc/marked_line.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

using nlohmann::json;

const std::string kProbe = std::string(SOURCE_DIR) + "/tests/python/hang_probe.py";

// The line of hang_probe.py that carries `marker`, as "hang_probe.py:N".
std::string ProbeLine(const std::string& marker) { return MarkedLine(kProbe, marker); }

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

// A script run by the default interpreter (python3 from the job's PATH, a virtual environment's)
// is read from a shell that does not have that environment on its PATH: the workers' interpreter
// is an absolute path, and its environment's py-spy is beside it.
TEST(DlrunStacks, AScriptsStacksAreReadFromAShellWithoutTheWorkersEnvironmentOnPath) {
  const std::string tmp = MakeTempDir();
  const std::string venv_bin = std::filesystem::path(TEST_PYTHON).parent_path().string();
  Started job = StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", kProbe},
                             {{"TMPDIR", tmp},
                              {"HANG_RANK", "1"},
                              {"PATH", venv_bin + ":/usr/bin:/bin"},
                              {"PYTHON_EXEC", ""}});
  ASSERT_TRUE(ReadUntil(job, "hang_probe: rank", 2, std::chrono::seconds(90))) << job.output;
  ProcResult r = RunCommand({DLRUN_BIN, "stacks"}, {{"TMPDIR", tmp}, {"PATH", "/usr/bin:/bin"}},
                            std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("no py-spy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(ProbeLine("the stalled rank's line")), std::string::npos) << r.output;
  kill(job.pid, SIGTERM);
  FinishCommand(job, std::chrono::seconds(60));
  std::filesystem::remove_all(tmp);
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

std::set<int> RanksIn(const json& report) {
  std::set<int> ranks;
  for (const json& r : report["ranks"]) ranks.insert(r["rank"].get<int>());
  return ranks;
}

// Two agents on loopback, two ranks each, rank 2 stalled: `dlrun stacks` on either node returns
// every node's ranks through the rendezvous, `--this-node` its own, and `--rdzv-endpoint
// --rdzv-id` from a machine that runs none of them the whole job again.
TEST(DlrunStacks, OneCommandReturnsEveryNodesRanksThroughTheRendezvous) {
  const std::string tmp_a = MakeTempDir(), tmp_b = MakeTempDir(), tmp_c = MakeTempDir();
  const std::string ep = "127.0.0.1:" + std::to_string(FreeTcpPort());
  const std::vector<std::string> cmd = {
      DLRUN_BIN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
      "--rdzv-endpoint", ep, "--rdzv-id", "stacks-job", "--rdzv-conf",
      "heartbeat_interval=0.5", TEST_PYTHON, kProbe};
  const std::string token = "stacks-test-token";
  Started a = StartCommand(cmd, {{"TMPDIR", tmp_a}, {"DLRUN_RDZV_TOKEN", token}});
  ASSERT_TRUE(ReadUntil(a, "hosting the rendezvous", 1, std::chrono::seconds(60))) << a.output;
  Started b = StartCommand(cmd, {{"TMPDIR", tmp_b}, {"DLRUN_RDZV_TOKEN", token}});
  ASSERT_TRUE(ReadUntil(a, "hang_probe: rank", 2, std::chrono::seconds(90))) << a.output;
  ASSERT_TRUE(ReadUntil(b, "hang_probe: rank", 2, std::chrono::seconds(90))) << b.output;

  ProcResult all = RunCommand({DLRUN_BIN, "stacks", "--json"}, {{"TMPDIR", tmp_b}});
  ASSERT_EQ(all.exit_code, 0) << all.output;
  const json j = json::parse(all.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << all.output;
  EXPECT_EQ(RanksIn(j), std::set<int>({0, 1, 2, 3})) << all.output;
  EXPECT_EQ(j["suspects"], json({2})) << all.output;
  EXPECT_TRUE(j["missing_nodes"].empty()) << all.output;

  ProcResult own = RunCommand({DLRUN_BIN, "stacks", "--json", "--this-node"}, {{"TMPDIR", tmp_b}});
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_EQ(RanksIn(json::parse(own.output, nullptr, false)).size(), 2u) << own.output;

  ProcResult elsewhere = RunCommand({DLRUN_BIN, "stacks", "--json", "--rdzv-endpoint", ep,
                                     "--rdzv-id", "stacks-job"},
                                    {{"TMPDIR", tmp_c}, {"DLRUN_RDZV_TOKEN", token}});
  ASSERT_EQ(elsewhere.exit_code, 0) << elsewhere.output;
  EXPECT_EQ(RanksIn(json::parse(elsewhere.output, nullptr, false)),
            std::set<int>({0, 1, 2, 3})) << elsewhere.output;
  // A wrong token gets nothing.
  ProcResult wrong = RunCommand({DLRUN_BIN, "stacks", "--rdzv-endpoint", ep, "--rdzv-id",
                                 "stacks-job"},
                                {{"TMPDIR", tmp_c}, {"DLRUN_RDZV_TOKEN", "not-the-token"}});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;

  kill(a.pid, SIGTERM);
  kill(b.pid, SIGTERM);
  FinishCommand(a, std::chrono::seconds(60));
  FinishCommand(b, std::chrono::seconds(60));
  for (const std::string& d : {tmp_a, tmp_b, tmp_c}) std::filesystem::remove_all(d);
}

// The live page's data: after a capture before kill, /api/job has its summary (where, why, the
// groups and their frames) while the job goes on.
TEST(DlrunStacks, TheLastCaptureIsInApiJob) {
  const std::string tmp = MakeTempDir();
  // Attempt 0: ranks 0 and 1 say they are in place and sleep in wait_here(); rank 2 then dies
  // of SIGSEGV. Attempt 1: every rank sleeps until the stop file exists.
  const std::string program = R"(
import os, signal, sys, time
d, rank = sys.argv[1], int(os.environ["RANK"])
def wait_here():
    while not os.path.exists(d + "/stop"):
        time.sleep(0.05)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if rank == 2:
        while not all(os.path.exists(f"{d}/ready.{r}") for r in (0, 1)):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGSEGV)
    open(f"{d}/ready.{rank}", "w").close()
wait_here()
)";
  { std::ofstream(tmp + "/prog.py") << program; }
  Started job = StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "3",
                              "--max-restarts", "1", "--metrics-port", "0", "--metrics-addr",
                              "127.0.0.1", TEST_PYTHON, tmp + "/prog.py", tmp},
                             {{"TMPDIR", tmp}});
  ASSERT_TRUE(ReadUntil(job, "job telemetry on http://127.0.0.1:", 1, std::chrono::seconds(60)))
      << job.output;
  const size_t at = job.output.find("job telemetry on http://127.0.0.1:") + 34;
  const std::string port = job.output.substr(at, job.output.find('/', at) - at);
  ASSERT_TRUE(ReadUntil(job, "stacks of 2 live worker(s) before the stop", 1,
                        std::chrono::seconds(60)))
      << job.output;
  const std::string fetch = "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("
                            "'http://127.0.0.1:" + port + "/api/job', timeout=5).read().decode())";
  json stacks;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (stacks.is_null() && std::chrono::steady_clock::now() < deadline) {
    const json j = json::parse(RunCommand({TEST_PYTHON, "-c", fetch}).output, nullptr, false);
    if (j.is_object() && j.contains("stacks")) stacks = j["stacks"];
  }
  // The live page shows it, as a browser renders it (headless Chromium, Debian's package).
  std::string page;
  if (RunCommand({"sh", "-c", "command -v chromium"}).exit_code == 0) {
    page = RunCommand({"timeout", "60", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                       "--disable-dev-shm-usage", "--user-data-dir=" + tmp + "/chromium",
                       "--virtual-time-budget=4000", "--dump-dom",
                       "http://127.0.0.1:" + port + "/"})
               .output;
  }
  { std::ofstream(tmp + "/stop") << ""; }
  EXPECT_EQ(FinishCommand(job, std::chrono::seconds(60)), 0) << job.output;
  if (page.empty()) {
    ADD_FAILURE() << "chromium is missing (scripts/install-deps --system): the page is unchecked";
  } else {
    EXPECT_NE(page.find("<div id=\"stacks\" style=\"\">"), std::string::npos) << page;
    EXPECT_NE(page.find("a worker failed on "), std::string::npos) << page;
    EXPECT_NE(page.find("no suspects: every rank read had the same stack"), std::string::npos);
    EXPECT_NE(page.find("ranks 0,1 ("), std::string::npos) << page;
    EXPECT_NE(page.find("wait_here"), std::string::npos) << page;
  }
  ASSERT_TRUE(stacks.is_object()) << job.output;
  EXPECT_EQ(stacks["why"], "a worker failed");
  EXPECT_TRUE(stacks["suspects"].empty()) << stacks.dump();
  ASSERT_EQ(stacks["groups"].size(), 1u) << stacks.dump();
  EXPECT_EQ(stacks["groups"][0]["ranks"], json({0, 1}));
  EXPECT_TRUE(HasFrame(stacks["groups"][0]["frames"], "wait_here")) << stacks.dump();
  std::filesystem::remove_all(tmp);
}

// The user's job ended while another job of theirs runs on the node: `dlrun stacks` names the job
// it reads (the other one's run id, not silently), and the ended job's run id finds nothing.
TEST(DlrunStacks, TheJobReadIsNamedAndAnEndedJobsRunIdFindsNone) {
  HungJob other;
  ASSERT_TRUE(ReadUntil(other.job, "hang_probe: rank", 4, std::chrono::seconds(90)))
      << other.job.output;
  ProcResult ended = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "1", "/bin/true"},
                                {{"TMPDIR", other.tmp}}, std::chrono::seconds(60));
  ASSERT_EQ(ended.exit_code, 0) << ended.output;
  auto run_id = [](const std::string& out) {
    const size_t at = out.find("run id ");
    return at == std::string::npos ? std::string() : out.substr(at + 7, out.find_first_of(" \n", at + 7) - at - 7);
  };
  const std::string ended_id = run_id(ended.output), other_id = run_id(other.job.output);
  ASSERT_FALSE(ended_id.empty()) << ended.output;
  ASSERT_FALSE(other_id.empty()) << other.job.output;
  ProcResult r = other.Stacks();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", job " + other_id + " (agent pid "), std::string::npos) << r.output;
  const json j = json::parse(other.Stacks({"--json"}).output, nullptr, false);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["job"].get<std::string>().rfind(other_id + " (agent pid ", 0), 0u) << j.dump();
  ProcResult gone = other.Stacks({"--run-id", ended_id});
  EXPECT_EQ(gone.exit_code, 1) << gone.output;
  EXPECT_NE(gone.output.find("no running dlrun job with run id '" + ended_id + "'"),
            std::string::npos) << gone.output;
}

// Two static jobs on one node with torchrun's default run id "none" (pods set up by hand, no
// --rdzv-id): `dlrun stacks` names each one's --log-dir, and says --run-id cannot tell them apart
// (before: "pick one with --run-id or --log-dir", listing "none" twice).
TEST(DlrunStacks, JobsThatShareTheDefaultRunIdAreToldApartByTheirLogDirs) {
  const std::string tmp = MakeTempDir();
  std::vector<Started> jobs;
  for (int i = 0; i < 2; ++i) {
    jobs.push_back(StartCommand(
        {DLRUN_BIN, "--nnodes", "1", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
         "--master-port", std::to_string(FreeTcpPort()), "/bin/sleep", "120"},
        {{"TMPDIR", tmp}}));
  }
  for (Started& j : jobs) {
    ASSERT_TRUE(ReadUntil(j, "run id none\n", 1, std::chrono::seconds(60))) << j.output;
  }
  ProcResult r = RunCommand({DLRUN_BIN, "stacks"}, {{"TMPDIR", tmp}}, std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const Started& j : jobs) {
    EXPECT_NE(r.output.find(absl::StrCat("none (agent pid ", j.pid, ", --log-dir ")),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find("pick one with --log-dir (their run ids are the same"), std::string::npos)
      << r.output;
  for (Started& j : jobs) {
    kill(j.pid, SIGTERM);
    FinishCommand(j, std::chrono::seconds(60));
  }
  std::filesystem::remove_all(tmp);
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
  // The faulting frame comes from Python's faulthandler, which dlrun turns on.
  const std::string crash = ProbeLine("the crash's line") + " stall";
  EXPECT_NE(r.output.find("rank 2 got SIGSEGV at "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(crash + "; the other 3 ranks were in wait_for_peer at " +
                          ProbeLine("where the others wait for a crashed rank")),
            std::string::npos) << r.output;
  std::ifstream in(tmp + "/report.json");
  const json report = json::parse(in, nullptr, false);
  ASSERT_TRUE(report.is_object()) << r.output;
  const json& f = report["failures"][0];
  EXPECT_EQ(f["class"], "segfault");
  EXPECT_EQ(f["rank"], 2);
  EXPECT_EQ(f["stacks"]["groups"][0]["ranks"], json({0, 1, 3})) << f.dump();
  // The failed rank is the cause: no live rank is made a suspect by its stack.
  EXPECT_TRUE(f["stacks"]["suspects"].empty()) << f.dump();
  EXPECT_NE(r.output.find("rank 2 failed, not read"), std::string::npos) << r.output;
  EXPECT_TRUE(absl::EndsWith(f["faulting_frame"].get<std::string>(), "/" + crash)) << f.dump();
  // The dump is kept beside the error files, in the attempt's directory.
  bool kept = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp)) {
    kept |= e.path().filename() == "stacks.txt";
  }
  EXPECT_TRUE(kept) << r.output;
  std::filesystem::remove_all(tmp);
}

// A C++ worker of the worker library: its crash handler writes the native frames, and the
// agent names the faulting one with eu-addr2line (the function, its file and line).
TEST(DlrunStacks, ACxxWorkersSegfaultIsNamedAtItsFaultingFrame) {
  const std::string tmp = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "1", "--report-json",
                             tmp + "/report.json", CRASH_PROBE},
                            {{"TMPDIR", tmp}});
  if (r.output.find("crash_probe: no crash trace installed") != std::string::npos) {
    GTEST_SKIP() << "SIGSEGV has a handler already (a sanitizer's): the library leaves it be";
  }
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dlrun::worker: fatal signal SIGSEGV; native frames"),
            std::string::npos) << r.output;
  std::ifstream in(tmp + "/report.json");
  const json report = json::parse(in, nullptr, false);
  ASSERT_TRUE(report.is_object()) << r.output;
  const json& f = report["failures"][0];
  EXPECT_EQ(f["class"], "segfault");
  const std::string frame = f.value("faulting_frame", "");
  EXPECT_NE(frame.find("crash_probe.cc:"), std::string::npos) << frame << "\n" << r.output;
  EXPECT_NE(frame.find("CrashProbeWritesThroughNull"), std::string::npos) << frame;
  EXPECT_NE(r.output.find("rank 0 crashed in "), std::string::npos) << r.output;
  std::filesystem::remove_all(tmp);
}

// Flight Recorder with Gloo (torch 2.15 records Gloo's collectives; the dump comes through
// dlrun_report): rank 2 sleeps before its 10th all_reduce, the others' all_reduce times out after
// 3 s, every rank dumps into the attempt's directory, and the report names rank 2 as the one
// that never entered all_reduce #10.
TEST(DlrunFlightRecorder, AGlooTimeoutNamesTheRankThatNeverEnteredTheCollective) {
  const std::string tmp = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "4", "--log-dir",
                             tmp + "/logs", "--report-json", tmp + "/report.json", TEST_PYTHON,
                             kProbe},
                            {{"TMPDIR", tmp}, {"HANG_STEP", "10"}, {"COLLECTIVE_TIMEOUT", "3"},
                             {"FLIGHT_RECORDER", "1"}},
                            std::chrono::seconds(90));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("flight recorder: rank 2 never entered gloo:all_reduce #10 of group 0 "
                          "(default_pg); ranks 0-1,3 did"),
            std::string::npos) << r.output;
  int dumps = 0;  // in LOG_DIR/RUN_ID/attempt_0/flight_recorder
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp + "/logs")) {
    dumps += e.path().parent_path().filename() == "flight_recorder" &&
             e.path().filename().string().rfind("rank_", 0) == 0;
  }
  EXPECT_EQ(dumps, 4) << r.output;
  std::ifstream in(tmp + "/report.json");
  const json report = json::parse(in, nullptr, false);
  ASSERT_TRUE(report.is_object()) << r.output;
  const json& fr = report["failures"][0]["flight_recorder"];
  EXPECT_EQ(fr["never_entered"], json({2})) << report.dump();
  EXPECT_EQ(fr["entered"], json({0, 1, 3})) << report.dump();
  EXPECT_EQ(fr["seq"], 10) << report.dump();
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace dlrun::testing
