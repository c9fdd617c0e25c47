// The agent's user-visible behaviour: the torchrun environment, output, hangs, signals, root
// causes, and a real torch.distributed program compared with torchrun itself.
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

constexpr auto kAgentDeadline = std::chrono::seconds(60);

std::map<std::string, std::string> ParseEnv(const std::string& text) {
  std::map<std::string, std::string> m;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    size_t eq = line.find('=');
    if (eq != absl::string_view::npos) m[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return m;
}

TEST(DlrunAgent, EveryTorchrunVariableForOneToFourWorkers) {
  for (int n = 1; n <= 4; ++n) {
    const std::string dir = MakeTempDir();
    ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", std::to_string(n), "--max-restarts",
                               "2", "--role", "trainer", "sh", "-c", "env > " + dir + "/env.$RANK"},
                              {}, kAgentDeadline);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::set<std::string> ports;
    for (int rank = 0; rank < n; ++rank) {
      auto e = ParseEnv(ReadFile(dir + "/env." + std::to_string(rank)));
      const std::string rs = std::to_string(rank), ns = std::to_string(n);
      EXPECT_EQ(e["RANK"], rs);
      EXPECT_EQ(e["LOCAL_RANK"], rs);
      EXPECT_EQ(e["GROUP_RANK"], "0");
      EXPECT_EQ(e["ROLE_RANK"], rs);
      EXPECT_EQ(e["ROLE_NAME"], "trainer");
      EXPECT_EQ(e["WORLD_SIZE"], ns);
      EXPECT_EQ(e["LOCAL_WORLD_SIZE"], ns);
      EXPECT_EQ(e["ROLE_WORLD_SIZE"], ns);
      EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
      EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
      EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
      EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "2");
      EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "False");
      EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
      EXPECT_EQ(e["DLRUN_NCCL_ERROR_HANDLING_DEFAULT"], "1");
      EXPECT_FALSE(e["TORCHELASTIC_RUN_ID"].empty());
      EXPECT_NE(e["TORCHELASTIC_ERROR_FILE"].find("/" + rs + "/error.json"), std::string::npos);
      EXPECT_FALSE(e["DLRUN_HEARTBEAT_FD"].empty());
      cpu_set_t cpus;
      sched_getaffinity(0, sizeof cpus, &cpus);
      if (n > 1) {
        EXPECT_EQ(e["OMP_NUM_THREADS"], std::to_string(std::max(1, CPU_COUNT(&cpus) / n)));
      } else {  // one worker: left as it was, as torchrun does
        const char* mine = std::getenv("OMP_NUM_THREADS");
        EXPECT_EQ(e["OMP_NUM_THREADS"], mine ? mine : "");
      }
      ports.insert(e["MASTER_PORT"]);
    }
    EXPECT_EQ(ports.size(), 1u);
  }
}

// A user's NCCL error handling reaches the workers as it is, and is not marked as dlrun's default
// (which dlrun_recovery would turn off).
TEST(DlrunAgent, TheUsersNcclErrorHandlingIsKeptAndNotMarkedAsDlrunsDefault) {
  const std::string dir = MakeTempDir();
  ProcResult r =
      RunCommand({DLRUN_BIN, "--nproc-per-node", "1", "sh", "-c", "env > " + dir + "/env"},
                 {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, kAgentDeadline);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto e = ParseEnv(ReadFile(dir + "/env"));
  EXPECT_EQ(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3");
  EXPECT_EQ(e["NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(e.count("DLRUN_NCCL_ERROR_HANDLING_DEFAULT"), 0u);
}

// The run directories dlrun made under a --log-dir (torchrun's <run_id>_<random>), sorted.
std::vector<std::string> RunDirs(const std::string& log_dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(log_dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DlrunAgent, OutputIsPrefixedFilteredAndLogged) {
  const std::string log_dir = MakeTempDir();
  ProcResult r =
      RunCommand({DLRUN_BIN, "--nproc-per-node", "2", "--log-dir", log_dir, "--local-ranks-filter",
                  "1", "sh", "-c", "echo out-$RANK; echo err-$RANK >&2"},
                 {}, kAgentDeadline);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(RunDirs(log_dir).size(), 1u);
  const std::string logs = RunDirs(log_dir)[0];
  EXPECT_NE(r.output.find("[rank 1]: out-1\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1]: err-1\n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("out-0"), std::string::npos) << r.output;  // filtered from the console
  EXPECT_EQ(ReadFile(logs + "/attempt_0/0/stdout.log"), "out-0\n");  // but still logged
  EXPECT_EQ(ReadFile(logs + "/attempt_0/0/stderr.log"), "err-0\n");
  EXPECT_EQ(ReadFile(logs + "/attempt_0/1/stdout.log"), "out-1\n");
  // --redirects 1: stdout goes to the files only.
  r = RunCommand({DLRUN_BIN, "--nproc-per-node", "1", "--log-dir", log_dir, "-r", "1", "sh", "-c",
                  "echo quiet; echo loud >&2"},
                 {}, kAgentDeadline);
  EXPECT_EQ(r.output.find("quiet"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0]: loud"), std::string::npos) << r.output;
  // A second run with the same --log-dir keeps the first run's logs (torchrun's layout).
  ASSERT_EQ(RunDirs(log_dir).size(), 2u);
  EXPECT_EQ(ReadFile(logs + "/attempt_0/0/stdout.log"), "out-0\n");
  int quiet_logs = 0;
  for (const std::string& d : RunDirs(log_dir)) {
    quiet_logs += ReadFile(d + "/attempt_0/0/stdout.log") == "quiet\n";
  }
  EXPECT_EQ(quiet_logs, 1);
}

// A --log-dir that cannot be made says why (not mkdtemp's "No such file or directory" after
// the real failure), in one line, before any worker starts.
TEST(DlrunAgent, ALogDirThatCannotBeMadeSaysWhy) {
  const std::string dir = MakeTempDir();
  const std::string file = dir + "/a-file";
  std::ofstream(file) << "x";
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--nproc-per-node", "1", "--log-dir", file + "/logs", "sh", "-c", "echo started"},
      {}, kAgentDeadline);
  EXPECT_EQ(r.exit_code, 2) << r.output;  // bad input, as a bad flag
  EXPECT_EQ(r.output, "dlrun: cannot create the log directory '" + file +
                          "/logs': Not a directory\n");
  std::filesystem::remove_all(dir);
}

TEST(DlrunAgent, HungWorkerIsRestarted) {
  // The worker heartbeats once, then hangs; on the restart it succeeds.
  ProcResult r =
      RunCommand({DLRUN_BIN, "--nproc-per-node", "2", "--hang-timeout", "0.5", "--max-restarts",
                  "1", "bash", "-c",
                  "printf h >&$DLRUN_HEARTBEAT_FD; [ $TORCHELASTIC_RESTART_COUNT = 1 ] && exit 0; "
                  "exec sleep 600"},
                 {}, kAgentDeadline);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("hung: no heartbeat for 0.5 s"), std::string::npos) << r.output;
  // A program that never heartbeats is not affected by --hang-timeout.
  r = RunCommand(
      {DLRUN_BIN, "--nproc-per-node", "1", "--hang-timeout", "0.05", "sh", "-c", "sleep 0.3"}, {},
      kAgentDeadline);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Without restarts left the job fails with code 124.
  r = RunCommand({DLRUN_BIN, "--nproc-per-node", "1", "--hang-timeout", "0.2", "bash", "-c",
                  "printf h >&$DLRUN_HEARTBEAT_FD; exec sleep 600"},
                 {}, kAgentDeadline);
  EXPECT_EQ(r.exit_code, 124) << r.output;
}

TEST(DlrunAgent, Sigusr1IsPassedOnAndTheJobContinues) {
  Started s = StartCommand({DLRUN_BIN, "--nproc-per-node", "2", "--signals-to-handle",
                            "SIGTERM,SIGINT,SIGUSR1", "bash", "-c",
                            "trap 'echo usr1-$RANK; exit 0' USR1; echo ready; "
                            "while :; do sleep 1 & wait $!; done"});
  ASSERT_TRUE(ReadUntil(s, "ready", 2, kAgentDeadline)) << s.output;
  kill(s.pid, SIGUSR1);
  EXPECT_EQ(FinishCommand(s, kAgentDeadline), 0) << s.output;  // workers exited 0 after the signal
  EXPECT_NE(s.output.find("usr1-0"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("usr1-1"), std::string::npos) << s.output;
}

TEST(DlrunAgent, RootCauseIsTheEarliestErrorFileNotTheFirstExit) {
  // Rank 1 records an error at t=1000 and exits; rank 0 records an earlier one (t=500) but exits
  // later. torchrun's rule: the earliest timestamp is the root cause.
  const std::string script =
      "if [ $RANK = 1 ]; then echo '{\"message\":{\"message\":\"late error\",\"extraInfo\":"
      "{\"timestamp\":\"1000\"}}}' > $TORCHELASTIC_ERROR_FILE; exit 3; fi; "
      "echo '{\"message\":{\"message\":\"ValueError: the real cause\",\"extraInfo\":"
      "{\"timestamp\":\"500\"}}}' > $TORCHELASTIC_ERROR_FILE; trap 'exit 4' TERM; "
      "while :; do sleep 1 & wait $!; done";
  ProcResult r =
      RunCommand({DLRUN_BIN, "--nproc-per-node", "2", "--grace-period", "5", "bash", "-c", script},
                 {}, kAgentDeadline);
  EXPECT_NE(r.exit_code, 0);
  // Rank 0 was stopped by the agent, so only rank 1's file counts here.
  EXPECT_NE(r.output.find("Root cause (first failure): rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("late error"), std::string::npos) << r.output;
  // Both failing on their own, where the earlier timestamp wins although it exited second,
  // races here (the agent may stop rank 0 first); it is pinned in-process, on a fake clock:
  // tests/launcher/agent/root_cause_test.cc (AgentRootCause.*).
}

// A program that dies before it could write an error file (a SyntaxError here) is named by
// what it said: the job's last line gives the exception's line, not only "exit code 1"
// (issue 41, point 4).
TEST(DlrunAgent, ASyntaxErrorsRootCauseLineSaysTheException) {
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/broken.py") << "import os\ndef f(:\n    pass\n";
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "1", "python3", dir + "/broken.py"}, {},
                            kAgentDeadline);
  EXPECT_NE(r.exit_code, 0);
  const size_t at = r.output.find("Root cause (first failure): rank 0");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  EXPECT_NE(line.find("exit code 1: SyntaxError: invalid syntax"), std::string::npos) << line;
}

nlohmann::json RunDdpCheck(const std::vector<std::string>& launcher) {
  const std::string dir = MakeTempDir();
  std::vector<std::string> cmd = launcher;
  cmd.push_back(std::string(SOURCE_DIR) + "/tests/python/ddp_check.py");
  cmd.push_back(dir);
  ProcResult r = RunCommand(cmd, {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json all;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string text = ReadFile(dir + "/rank" + std::to_string(rank) + ".json");
    if (text.empty()) return all;
    all.push_back(nlohmann::json::parse(text));
  }
  return all;
}

TEST(DlrunAgent, TorchDistributedProgramSeesWhatTorchrunGivesIt) {
  if (!std::filesystem::exists(TEST_PYTHON) ||
      RunCommand({TEST_PYTHON, "-c", "import torch.distributed"}).exit_code != 0) {
    GTEST_SKIP() << "no torch in " << TEST_PYTHON << " (scripts/install-deps installs it)";
  }
  nlohmann::json ours = RunDdpCheck({DLRUN_BIN, "--standalone", "--nproc-per-node", "2",
                                     TEST_PYTHON});
  nlohmann::json theirs = RunDdpCheck({TEST_PYTHON, "-m", "torch.distributed.run",
                                       "--standalone", "--nproc_per_node", "2"});
  ASSERT_EQ(ours.size(), 2u);
  ASSERT_EQ(theirs.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    nlohmann::json a = ours[rank], b = theirs[rank];
    EXPECT_EQ(a["allreduce"], 3.0);  // gloo allreduce over both ranks really happened
    // torchrun --standalone says "localhost", dlrun the address itself, and torchrun 2.x's agent
    // hosts the store (docs/COMPAT.md); all else is equal.
    for (const char* k : {"MASTER_ADDR", "TORCHELASTIC_USE_AGENT_STORE", "numpy_draw", "random_draw"}) {
      a.erase(k);
      b.erase(k);
    }
    EXPECT_EQ(a, b) << "dlrun: " << a.dump() << "\ntorchrun: " << b.dump();
  }
  // Unseeded generators differ across ranks under both (dlrun's forks are reseeded as fresh
  // interpreters are seeded).
  for (const char* k : {"numpy_draw", "random_draw"}) {
    EXPECT_NE(ours[0][k], ours[1][k]) << k;
    EXPECT_NE(theirs[0][k], theirs[1][k]) << k;
  }
}

}  // namespace
}  // namespace dlrun::testing
