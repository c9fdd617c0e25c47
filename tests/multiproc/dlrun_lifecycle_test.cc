// The agent's promises about its workers' lives: none outlives it, signals reach them.
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

}  // namespace
}  // namespace dlrun::testing
