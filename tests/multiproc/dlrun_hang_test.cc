// Hang detection with real processes (docs/USAGE.md, "Hangs"): a 2-rank Gloo job
// (tests/python/hang_probe.py) whose rank 1 stops taking part while rank 0 waits in all_reduce,
// read by the real py-spy. With no flags the agent says where every rank is within a minute;
// with step records it stops, names, captures and restarts; --hang-timeout acts on a group
// that never heartbeats; a SIGSTOPped rank is named as such.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "multiproc/marked_line.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

const std::string kHangProbe = std::string(SOURCE_DIR) + "/tests/python/hang_probe.py";

// The line of hang_probe.py that carries `marker`, as "hang_probe.py:N".
std::string ProbeLine(const std::string& marker) { return MarkedLine(kHangProbe, marker); }

std::map<std::string, std::string> ProbeEnv(const std::string& tmp,
                                            std::map<std::string, std::string> more) {
  more.insert({{"TMPDIR", tmp},
               {"PYTHONPATH", std::string(SOURCE_DIR) + "/python"},
               {"OMP_NUM_THREADS", "1"},
               {"HANG_RANK", "1"},
               {"HANG_STEP", "5"}});
  return more;
}

// The log line that has `needle`, or "".
std::string LineWith(const std::string& out, const std::string& needle) {
  const size_t at = out.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = out.rfind('\n', at) + 1;
  return out.substr(begin, out.find('\n', at) - begin);
}

TEST(DlrunHang, WithNoFlagsAnIdleGroupGetsOneLineSayingWhereEveryRankIsWithinAMinute) {
  const std::string tmp = MakeTempDir();
  Started job =
      StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", TEST_PYTHON, kHangProbe},
                   ProbeEnv(tmp, {}));
  ASSERT_TRUE(ReadUntil(job, "hang_probe: rank", 2, std::chrono::seconds(90))) << job.output;
  const auto hung_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(ReadUntil(job, "every rank has used under", 1, std::chrono::seconds(60)))
      << job.output;
  const double after_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - hung_at).count();
  EXPECT_LT(after_s, 60) << job.output;
  const std::string line = LineWith(job.output, "every rank has used under");
  EXPECT_NE(line.find("rank 1 is in stall at " + ProbeLine("the stalled rank's line")),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("rank 0 waits in all_reduce at"), std::string::npos) << line;
  EXPECT_NE(line.find(ProbeLine("where the others wait for a stalled rank")), std::string::npos)
      << line;
  // Said, not acted on: the job still runs.
  EXPECT_EQ(Count(job.output, "stopping the worker group"), 0u) << job.output;
  kill(job.pid, SIGTERM);
  FinishCommand(job, std::chrono::seconds(60));
  std::filesystem::remove_all(tmp);
}

TEST(DlrunHang, ARankWhoseStepRecordsStopIsNamedFromTheStacksCapturedAndRestarted) {
  const std::string tmp = MakeTempDir();
  const std::string report = tmp + "/report.json";
  // A floor of 8 s: short for the test, long enough that a loaded machine (sanitizers, tests in
  // parallel) stalling a healthy rank between its records is not taken for the hang.
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--hang-floor", "8", "--max-restarts",
       "1", "--report-json", report, TEST_PYTHON, kHangProbe},
      ProbeEnv(tmp, {{"REPORT_STEPS", "1"}, {"HANG_STEP", "12"}}), std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Both ranks' records stop; the stacks say which one holds the other up.
  const std::string line = LineWith(r.output, "stopping the worker group");
  EXPECT_NE(line.find("rank 1 hung"), std::string::npos) << line;
  EXPECT_NE(line.find("no step record for"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 1 is in stall at"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 0 waits in all_reduce at"), std::string::npos) << line;
  EXPECT_NE(r.output.find("suspects: rank 1;"), std::string::npos) << r.output;  // the capture
  EXPECT_NE(r.output.find("restarting the worker group after a hang: 1 of 1"), std::string::npos)
      << r.output;
  const nlohmann::json j = nlohmann::json::parse(ReadFile(report), nullptr, false);
  ASSERT_TRUE(j.is_object()) << ReadFile(report);
  ASSERT_TRUE(j.contains("failures") && j["failures"].size() == 1) << j.dump();
  EXPECT_EQ(j["failures"][0]["rank"], 1) << j.dump();
  EXPECT_EQ(j["failures"][0]["class"], "hang") << j.dump();
  std::filesystem::remove_all(tmp);
}

// The same without py-spy (DLRUN_PY_SPY names none): no stack is read, and the rank sleeping in
// its own work is named from the system call its main thread is blocked in, not the one whose
// records the hang detection happened to judge first (it named rank 0, waiting in all_reduce).
TEST(DlrunHang, WithoutPySpyTheRankInItsOwnWorkIsNamedNotTheOneWaiting) {
  const std::string tmp = MakeTempDir();
  for (const char* hang_rank : {"1", "0"}) {
    ProcResult r = RunCommand(
        {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--hang-floor", "8", "--max-restarts",
         "1", TEST_PYTHON, kHangProbe},
        ProbeEnv(tmp, {{"REPORT_STEPS", "1"}, {"HANG_STEP", "12"}, {"HANG_RANK", hang_rank},
                       {"DLRUN_PY_SPY", tmp + "/no-such-py-spy"}}),
        std::chrono::seconds(180));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::string line = LineWith(r.output, "stopping the worker group");
    const std::string other = hang_rank == std::string("1") ? "0" : "1";
    EXPECT_NE(line.find("rank " + std::string(hang_rank) + " hung: "), std::string::npos) << line;
    EXPECT_EQ(line.find("rank " + other + " hung"), std::string::npos) << line;
    EXPECT_NE(line.find("rank " + std::string(hang_rank) + "'s main thread is in its own work, "
                        "the others' wait on their communication threads"),
              std::string::npos) << line;
  }
  std::filesystem::remove_all(tmp);
}

// Work that is not a step, declared with dlrun_report.pause, is no hang however long it takes;
// the same wait undeclared is one (the agent's pipe reader once dropped the pause records).
TEST(DlrunHang, ADeclaredPauseLongerThanTheBoundIsNoHangAndAnUndeclaredOneIs) {
  const std::string tmp = MakeTempDir();
  auto run = [&](const char* undeclared) {
    return RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--hang-floor", "4",
                       "--max-restarts", "0", TEST_PYTHON, kHangProbe},
                      ProbeEnv(tmp, {{"REPORT_STEPS", "1"},
                                     {"HANG_KIND", "pause"},
                                     {"HANG_STEP", "8"},
                                     {"PAUSE_S", "9"},
                                     {"PAUSE_UNDECLARED", undeclared}}),
                      std::chrono::seconds(120));
  };
  const ProcResult declared = run("0");
  EXPECT_EQ(declared.exit_code, 0) << declared.output;
  EXPECT_EQ(declared.output.find(" hung: "), std::string::npos) << declared.output;
  const ProcResult undeclared = run("1");
  EXPECT_EQ(undeclared.exit_code, 124) << undeclared.output;
  EXPECT_NE(undeclared.output.find("hung: no step record for"), std::string::npos)
      << undeclared.output;
  std::filesystem::remove_all(tmp);
}

TEST(DlrunHang, HangTimeoutForAProgramThatNeverHeartbeatsSaysSoAndStopsTheIdleGroup) {
  const std::string tmp = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--hang-timeout",
                             "4", TEST_PYTHON, kHangProbe},
                            ProbeEnv(tmp, {}), std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_EQ(Count(r.output, "--hang-timeout 4 s: no rank has sent a heartbeat"), 1u) << r.output;
  const std::string line = LineWith(r.output, "stopping the worker group");
  EXPECT_NE(line.find("rank 1 hung: every rank has used under"), std::string::npos) << line;
  EXPECT_NE(r.output.find("job failed. Root cause (first failure): rank 1 hung"),
            std::string::npos)
      << r.output;
  std::filesystem::remove_all(tmp);
}

// A rank that wants a CPU and does not get one (a crowded node) uses almost none, and is no
// hang: the group's idle rule counts a runnable rank as busy (as it does one reading from
// storage: chaos on CI saw a cold start, mapping LibTorch from a slow disk, stopped as hung).
// The probe is pinned at SCHED_IDLE to a CPU where this test spins a process for longer than
// --hang-timeout; before the fix the agent stopped it as hung after 3 s.
TEST(DlrunHang, ARankWaitingForACpuIsNoHang) {
  const std::string tmp = MakeTempDir();
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &allowed)) ++cpu;
  const pid_t hog = fork();
  if (hog == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
    volatile uint64_t spins = 0;
    for (;;) spins = spins + 1;
  }
  Started job =
      StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "1", "--hang-timeout", "3",
                    TEST_PYTHON, std::string(SOURCE_DIR) + "/tests/python/starved_probe.py"},
                   {{"TMPDIR", tmp}, {"STARVE_CPU", std::to_string(cpu)}});
  const bool starving = ReadUntil(job, "starved_probe: starving", 1, std::chrono::seconds(60));
  // The idle rule would have acted by 3 s and a sample or two: give it 9.
  const bool hung = starving && ReadUntil(job, "hung", 1, std::chrono::seconds(9));
  kill(hog, SIGKILL);
  waitpid(hog, nullptr, 0);
  const int rc = FinishCommand(job, std::chrono::seconds(120));
  EXPECT_TRUE(starving) << job.output;
  EXPECT_FALSE(hung) << job.output;
  EXPECT_EQ(rc, 0) << job.output;
  EXPECT_NE(job.output.find("starved_probe: done"), std::string::npos) << job.output;
  std::filesystem::remove_all(tmp);
}

// A script under torchelastic's `@record` has its wrapper frame (in torch/distributed/elastic)
// outermost on every rank: that is no wait, so the sleeping rank is still named. And where every
// rank waits and the whole group is on this one node, the verdict does not send the user to
// "another node".
TEST(DlrunHang, RecordsWrapperIsNoWaitAndAOneNodeJobWhereAllWaitBlamesNoOtherNode) {
  const std::string tmp = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--hang-timeout",
                             "4", TEST_PYTHON, kHangProbe},
                            ProbeEnv(tmp, {{"HANG_RECORD", "1"}}), std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 124) << r.output;
  std::string line = LineWith(r.output, "stopping the worker group");
  EXPECT_NE(line.find("rank 1 hung"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 1 is in stall at"), std::string::npos) << line;
  EXPECT_EQ(line.find("another node"), std::string::npos) << line;
  r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--hang-timeout", "4",
                  TEST_PYTHON, kHangProbe},
                 ProbeEnv(tmp, {{"HANG_RECORD", "1"}, {"HANG_KIND", "recv"}}),
                 std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 124) << r.output;
  line = LineWith(r.output, "stopping the worker group");
  EXPECT_NE(line.find("every rank of the job is on this node: they wait on each other"),
            std::string::npos) << line;
  EXPECT_EQ(line.find("another node"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 1 waits in recv at"), std::string::npos) << line;
  std::filesystem::remove_all(tmp);
}

TEST(DlrunHang, ASigstoppedRankIsNamedAndTheGroupStopsWithoutWaitingOutTheGrace) {
  const std::string tmp = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--hang-timeout",
                             "4", TEST_PYTHON, kHangProbe},
                            ProbeEnv(tmp, {{"HANG_KIND", "stop"}}), std::chrono::seconds(180));
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 124) << r.output;
  const std::string line = LineWith(r.output, "stopping the worker group");
  EXPECT_NE(line.find("rank 1 hung"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 1 is stopped by a signal"), std::string::npos) << line;
  EXPECT_EQ(Count(r.output, "did not stop within"), 0u) << r.output;  // SIGCONT after SIGTERM
  EXPECT_LT(took_s, 30 + 10) << r.output;
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace dlrun::testing
