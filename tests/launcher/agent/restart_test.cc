// Restart counting: a failed worker restarts the whole local group until --max-restarts is used
// up, each group sees its restart number, and the job then ends with the worker's exit code; a
// death by a signal after the worker said it is done is no failure.
#include <fstream>

#include "agent/harness.h"
#include "gtest/gtest.h"
#include "launcher/workers/spawn_spec.h"

namespace dlrun::launcher::testing {
namespace {

TEST(AgentRestarts, FailedGroupRestartsUntilMaxRestartsThenExitsWithTheWorkersCode) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 1) f.ExitAfter(p.pid, seconds(1), 3);
    if (p.spec.local_rank == 0) f.ExitAfter(p.pid, seconds(100), 0);
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/2), 3);
  ASSERT_EQ(h.procs.groups_started(), 3);  // the first run and two restarts
  for (const auto& p : h.procs.procs) {
    EXPECT_EQ(p.spec.env.at("TORCHELASTIC_RESTART_COUNT"), std::to_string(p.attempt));
    EXPECT_EQ(p.spec.env.at("TORCHELASTIC_MAX_RESTARTS"), "2");
  }
  // Each time, the healthy local rank 0 was stopped with SIGTERM right after the failure.
  for (const auto& p : h.procs.procs) {
    if (p.spec.local_rank != 0) continue;
    auto s = h.procs.SentTo(p.pid);
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(s[0].sig, SIGTERM);
  }
}

// A worker that said its work is done ("D done", dlrun_report.done()) and then dies of a signal
// (the interpreter's teardown) is finished, not failed: no restart, exit 0. A signal without
// the record, an exit code after it, or a record from the other rank only, still fails.
TEST(AgentRestarts, ASignalAfterDoneIsAFinishAndNothingElseIs) {
  StepRecord done;
  done.kind = RecordKind::kDone;
  struct Case {
    const char* what;
    bool says_done;        // local rank 1 sends "D done" at 1 s
    bool other_says_done;  // local rank 0 does instead
    int sig, code;         // how local rank 1 ends at 2 s
    int want;
  } cases[] = {
      {"SIGABRT after done", true, false, SIGABRT, 0, 0},
      {"SIGSEGV after done", true, false, SIGSEGV, 0, 0},
      {"SIGABRT without done", false, false, SIGABRT, 0, 128 + SIGABRT},
      {"exit code 3 after done", true, false, 0, 3, 3},
      {"done said by the other rank", false, true, SIGABRT, 0, 128 + SIGABRT},
  };
  for (const Case& c : cases) {
    Harness h(2);
    h.options.exit_with_worker_code = true;
    h.procs.on_spawn = [&](FakeProcesses& f, FakeProcesses::Proc& p) {
      const bool one = p.spec.local_rank == 1;
      if (one ? c.says_done : c.other_says_done) f.RecordAfter(p.pid, seconds(1), done);
      if (!one) f.ExitAfter(p.pid, seconds(2), 0);
      if (one && c.sig != 0) f.KilledAfter(p.pid, seconds(2), c.sig);
      if (one && c.sig == 0) f.ExitAfter(p.pid, seconds(2), c.code);
    };
    EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), c.want) << c.what;
    EXPECT_EQ(h.procs.groups_started(), c.want == 0 ? 1 : 2) << c.what;
  }
}

TEST(AgentOutput, ConsolePrefixFollowsTheTemplateAndVirtualLocalRanksAreZero) {
  Harness h(2);
  h.options.hostname = "node7";
  h.options.console_prefix_template = "${hostname}:${role_name}:${rank}/${local_rank}| ";
  h.options.virtual_local_rank = true;
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(1), 0);
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/0), 0);
  ASSERT_EQ(h.procs.procs.size(), 2u);
  for (const auto& p : h.procs.procs) {
    const std::string lr = std::to_string(p.spec.local_rank);
    EXPECT_EQ(p.spec.console_prefix, "node7:default:" + lr + "/" + lr + "| ");
    EXPECT_EQ(p.spec.env.at("LOCAL_RANK"), "0");
    EXPECT_EQ(p.spec.env.at("RANK"), lr);
  }
  Harness plain(1);  // no template: dlrun's own prefix
  plain.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(1), 0);
  };
  EXPECT_EQ(plain.RunStatic(0), 0);
  EXPECT_EQ(plain.procs.procs.at(0).spec.console_prefix, "[rank 0]: ");
}

// The group's log table says the run id (a single-node job printed it nowhere, and `dlrun
// stacks --run-id` needs it) and, after a fault, how long each phase of the restart took.
TEST(AgentGroupTable, NamesTheRunIdAndTheRestartsPhases) {
  Assignment a;
  a.restart_count = 1;
  a.world_size = a.local_world_size = 2;
  a.master_addr = "127.0.0.1";
  a.master_port = 29500;
  a.run_id = "job-7";
  const SteadyTime t0{};
  const std::string table =
      GroupTable(a, {{0, 0, 100}, {1, 1, 101}},
                 {t0, t0 + milliseconds(5), t0 + milliseconds(15), t0 + milliseconds(17)});
  EXPECT_EQ(table,
            "restart 1: node 0 of 1, world size 2, master 127.0.0.1:29500, run id job-7 (after the "
            "fault: stop 5 ms, rendezvous 10 ms, spawn 2 ms)\n  local_rank  rank  pid\n"
            "  0           0     100\n  1           1     101");
}

TEST(AgentRestarts, AGroupThatSucceedsAfterARestartEndsTheJobWithZero) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    const bool first = p.attempt == 0;
    f.ExitAfter(p.pid, seconds(1), first && p.spec.local_rank == 0 ? 1 : 0);
  };
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 0);
  EXPECT_EQ(h.procs.groups_started(), 2);
}

TEST(AgentRestarts, ErrorFilesAndLogsGoToAFreshDirectoryPerAttempt) {
  Harness h(1);
  h.options.log_dir = h.options.run_dir + "/logs";
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(1), p.attempt == 0 ? 1 : 0);
  };
  EXPECT_EQ(h.RunStatic(1), 0);
  ASSERT_EQ(h.procs.procs.size(), 2u);
  EXPECT_EQ(h.procs.procs[0].spec.env.at("TORCHELASTIC_ERROR_FILE"),
            h.options.run_dir + "/attempt_0/0/error.json");
  EXPECT_EQ(h.procs.procs[1].spec.env.at("TORCHELASTIC_ERROR_FILE"),
            h.options.run_dir + "/attempt_1/0/error.json");
  EXPECT_EQ(h.procs.procs[1].spec.out.log_path, h.options.log_dir + "/attempt_1/0/stdout.log");
}

// The run directory's end: a scratch one goes after a success, stays (named) after a failure
// that left error files, and a kept one (--log-dir) always stays.
TEST(AgentRunDir, ScratchGoesAfterASuccessAndStaysWithAFailuresErrorFiles) {
  auto succeed = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(1), 0);
  };
  {
    Harness h(1);
    h.procs.on_spawn = succeed;
    EXPECT_EQ(h.RunStatic(0), 0);
    EXPECT_FALSE(h.procs.files.Exists(h.options.run_dir));
  }
  {
    Harness h(1);
    h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
      (void)f.files.Write(p.spec.env.at("TORCHELASTIC_ERROR_FILE"), R"({"message": "boom"})");
      f.ExitAfter(p.pid, seconds(1), 1);
    };
    EXPECT_EQ(h.RunStatic(0), 1);
    EXPECT_TRUE(h.procs.files.Exists(h.options.run_dir + "/attempt_0/0/error.json"));
  }
  {
    Harness h(1);
    h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
      f.ExitAfter(p.pid, seconds(1), 1);
    };
    EXPECT_EQ(h.RunStatic(0), 1);
    EXPECT_FALSE(h.procs.files.Exists(h.options.run_dir));  // a failure without error files
  }
  {
    Harness h(1);
    h.options.keep_run_dir = true;
    h.procs.on_spawn = succeed;
    EXPECT_EQ(h.RunStatic(0), 0);
    EXPECT_TRUE(h.procs.files.Exists(h.options.run_dir));
  }
}

}  // namespace
}  // namespace dlrun::launcher::testing
