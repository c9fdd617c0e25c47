// The agent's promises about its workers' lives: none outlives it, signals reach them, a crash
// in the teardown after the program said it is done is no failure.
#include <signal.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

constexpr auto kLifecycleDeadline = std::chrono::seconds(30);

// Starts 2 workers that print "ready <pid>" and then wait; returns their pids.
std::vector<int> StartReadyWorkers(Started& s, const std::string& worker_script) {
  s = StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "sh", "-c", worker_script});
  EXPECT_TRUE(ReadUntil(s, "ready ", 2, kLifecycleDeadline)) << s.output;
  std::vector<int> pids;
  for (absl::string_view line : absl::StrSplit(s.output, '\n')) {
    int pid = 0;
    // Lines arrive as "[rank N]: ready PID".
    size_t at = line.find("ready ");
    if (at != absl::string_view::npos && absl::SimpleAtoi(line.substr(at + 6), &pid)) {
      pids.push_back(pid);
    }
  }
  return pids;
}

TEST(DlrunLifecycle, SigkillOfTheAgentLeavesNoWorkerAlive) {
  Started s;
  std::vector<int> pids = StartReadyWorkers(s, "echo ready $$; exec sleep 600");
  ASSERT_EQ(pids.size(), 2u);
  kill(s.pid, SIGKILL);
  for (int pid : pids)
    EXPECT_TRUE(WaitForExit(pid, kLifecycleDeadline)) << "worker " << pid << " survived";
  FinishCommand(s, kLifecycleDeadline);
}

TEST(DlrunLifecycle, SigtermIsForwardedAndEndsAllWorkers) {
  Started s;
  // Workers trap SIGTERM and say so, proving they got it (not a SIGKILL).
  std::vector<int> pids = StartReadyWorkers(
      s, "trap 'echo got-term $RANK; exit 0' TERM; echo ready $$; while :; do sleep 1 & wait $!; done");
  ASSERT_EQ(pids.size(), 2u);
  kill(s.pid, SIGTERM);
  const int rc = FinishCommand(s, kLifecycleDeadline);
  EXPECT_EQ(rc, 128 + SIGTERM) << s.output;
  EXPECT_NE(s.output.find("got-term 0"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("got-term 1"), std::string::npos) << s.output;
  for (int pid : pids) EXPECT_TRUE(WaitForExit(pid, kLifecycleDeadline));
}

// A crash in the interpreter's teardown after the work (PyTorch's "terminate called without an
// active exception", emulated by an atexit abort): after dlrun_report.done() the rank counts as
// finished, with a warning; without it, or with an exit code, the job fails as before.
ProcResult RunTeardownProbe(std::map<std::string, std::string> env) {
  env.insert({{"PYTHONPATH", std::string(SOURCE_DIR) + "/python"}});
  return RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", TEST_PYTHON,
                     std::string(SOURCE_DIR) + "/tests/python/teardown_probe.py"},
                    env, kLifecycleDeadline);
}

TEST(DlrunLifecycle, ACrashInTheTeardownAfterDoneIsAFinishWithAWarning) {
  const ProcResult r = RunTeardownProbe({{"SAY_DONE", "1"}});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("died of SIGABRT after it said its work was done"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("all 2 worker(s) finished successfully"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("job failed"), std::string::npos) << r.output;
}

TEST(DlrunLifecycle, ACrashInTheTeardownWithoutDoneOrAnExitCodeAfterDoneStillFails) {
  const ProcResult crash = RunTeardownProbe({});
  EXPECT_EQ(crash.exit_code, 1) << crash.output;
  EXPECT_NE(crash.output.find("job failed. Root cause (first failure): rank 1"), std::string::npos)
      << crash.output;
  EXPECT_EQ(crash.output.find("after it said its work was done"), std::string::npos)
      << crash.output;
  const ProcResult code =
      RunTeardownProbe({{"SAY_DONE", "1"}, {"EXIT_CODE", "3"}, {"CRASH_RANK", "-1"}});
  EXPECT_NE(code.exit_code, 0) << code.output;
  EXPECT_NE(code.output.find("job failed"), std::string::npos) << code.output;
}

}  // namespace
}  // namespace dlrun::testing
