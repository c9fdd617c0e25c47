// The root cause of a failed job, torchrun's rule: the earliest error-file timestamp wins over
// the first exit; without error files, the first worker to exit; a signal is reported as
// 128 + N. Workers the agent stopped are never the cause.
#include "launcher/workers/root_cause.h"
#include "absl/strings/str_cat.h"
#include "agent/harness.h"
#include "gtest/gtest.h"
#include "launcher/base/bad_nodes.h"

namespace dlrun::launcher::testing {
namespace {

void WriteErrorFile(FileSystem& fs, const std::string& path, const std::string& message,
                    double timestamp) {
  ASSERT_TRUE(fs.Write(path, absl::StrCat(R"({"message": {"message": ")", message,
                                          R"(", "extraInfo": {"timestamp": ")", timestamp,
                                          R"("}}})"))
                  .ok());
}

TEST(RootCause, TheEarliestErrorFileWinsOverTheFirstExit) {
  std::vector<WorkerExit> exits = {{1, 1, 101, 1, 0, 10.0, false},   // exits first
                                   {0, 0, 100, 2, 0, 11.0, false}};  // but failed earlier
  auto errors = [](int lr) {
    return lr == 0 ? ErrorRecord{"ValueError: bad batch", 5.0, ""} : ErrorRecord{"late", 9.0, ""};
  };
  RootCause r = PickRootCause(exits, errors);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.exit.local_rank, 0);
  EXPECT_EQ(r.message, "ValueError: bad batch");
}

TEST(RootCause, WithoutErrorFilesTheFirstExitAndStoppedWorkersNeverCount) {
  std::vector<WorkerExit> exits = {{0, 4, 100, 0, SIGTERM, 10.0, true},  // stopped by the agent
                                   {2, 6, 102, 0, SIGSEGV, 11.0, false},
                                   {1, 5, 101, 7, 0, 12.0, false}};
  RootCause r = PickRootCause(exits, [](int) { return ErrorRecord{}; });
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.exit.global_rank, 6);
  EXPECT_EQ(r.exit.code(), 128 + SIGSEGV);
  EXPECT_EQ(r.message, "Signal 11 (SIGSEGV) received by PID 102");
  EXPECT_FALSE(PickRootCause({exits[0]}, [](int) { return ErrorRecord{}; }).found);
}

TEST(RootCause, FailuresAreClassifiedFromWhatTheWorkerLeft) {
  auto cls = [](int exit_code, int sig, std::string_view text, bool oom = false) {
    WorkerExit e{0, 0, 100, exit_code, sig, 1.0, false};
    return std::string(FailureClassName(ClassifyFailure(e, text, oom).cls));
  };
  EXPECT_EQ(cls(1, 0, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
            "cuda_oom");
  EXPECT_EQ(cls(1, 0, "RuntimeError: CUDA error: out of memory"), "cuda_oom");
  EXPECT_EQ(cls(0, SIGKILL, "", /*oom=*/true), "host_oom");
  EXPECT_EQ(cls(0, SIGKILL, ""), "signal");  // a SIGKILL the OOM killer did not send
  EXPECT_EQ(cls(1, 0, "", /*oom=*/true), "exit");
  EXPECT_EQ(cls(1, 0, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                      "Timed out waiting 1800000ms for recv operation to complete"),
            "collective_timeout");
  EXPECT_EQ(cls(0, SIGABRT, "[Rank 1] Watchdog caught collective operation timeout: "
                            "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds"),
            "collective_timeout");
  EXPECT_EQ(cls(1, 0, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                      "Connection closed by peer [127.0.0.1]:40512"),
            "peer_lost");
  EXPECT_EQ(cls(0, SIGSEGV, ""), "segfault");
  EXPECT_EQ(cls(0, SIGBUS, ""), "segfault");
  EXPECT_EQ(cls(0, SIGTERM, ""), "signal");
  EXPECT_EQ(cls(3, 0, "ValueError: bad batch"), "exit");
  WorkerExit e{0, 0, 100, 1, 0, 1.0, false};
  EXPECT_EQ(ClassifyFailure(e, "NCCL communicator was aborted; failure from rank 5 to peer rank 3",
                            false).peer_rank,
            3);
  EXPECT_FALSE(ClassifyFailure(e, "Connection reset by peer", false).peer_rank.has_value());
  EXPECT_EQ(LastLine("Traceback ...\r\nRuntimeError: boom\n\n  "), "RuntimeError: boom");
  EXPECT_EQ(LastLine("one line"), "one line");
  EXPECT_EQ(LastLine("\n \n"), "");
  EXPECT_NE(FailureAdvice(FailureClass::kCudaOom).find("smaller batch"), std::string::npos);
  EXPECT_EQ(FailureAdvice(FailureClass::kExit), "");
}

TEST(RootCause, AFailureRepeatsWhenItsClassRankAndStepAreTheLastOnes) {
  using C = FailureClass;
  const FailureSignature oom{C::kCudaOom, 3, 54, "CUDA out of memory"};
  EXPECT_TRUE(RepeatsTheLast(oom, {C::kCudaOom, 3, 55, "CUDA out of memory (other sizes)"}));
  EXPECT_FALSE(RepeatsTheLast(oom, {C::kCudaOom, 3, 57, "CUDA out of memory"}));  // got further
  EXPECT_FALSE(RepeatsTheLast(oom, {C::kCudaOom, 2, 54, "CUDA out of memory"}));  // other rank
  EXPECT_FALSE(RepeatsTheLast(oom, {C::kHostOom, 3, 54, ""}));                    // other class
  EXPECT_FALSE(RepeatsTheLast(oom, {C::kCudaOom, 3, -1, ""}));  // before any step this time
  EXPECT_TRUE(RepeatsTheLast({C::kSegfault, 0, -1, ""}, {C::kSegfault, 0, -1, ""}));
  EXPECT_TRUE(RepeatsTheLast({C::kHostOom, 1, 9, ""}, {C::kHostOom, 1, 9, ""}));
  // A plain exit repeats only with the same message at a known step (a torchrun-style worker
  // that fails until RESTART_COUNT is high enough still gets its restarts).
  EXPECT_TRUE(RepeatsTheLast({C::kExit, 1, 9, "ValueError: x"}, {C::kExit, 1, 9, "ValueError: x"}));
  EXPECT_FALSE(RepeatsTheLast({C::kExit, 1, 9, "ValueError: x"}, {C::kExit, 1, 9, "KeyError"}));
  EXPECT_FALSE(RepeatsTheLast({C::kExit, 1, -1, "exit code 1"}, {C::kExit, 1, -1, "exit code 1"}));
  // From outside: never.
  EXPECT_FALSE(RepeatsTheLast({C::kSignal, 1, 9, ""}, {C::kSignal, 1, 9, ""}));
  EXPECT_FALSE(RepeatsTheLast({C::kCollectiveTimeout, 1, 9, ""}, {C::kCollectiveTimeout, 1, 9, ""}));
  EXPECT_FALSE(RepeatsTheLast({C::kPeerLost, 1, 9, ""}, {C::kPeerLost, 1, 9, ""}));
}

// A CUDA OOM at the same place twice ends the job after the second attempt, not after every
// restart it was allowed, and says why.
TEST(AgentRootCause, AFailureThatRepeatsStopsAfterTheSecondAttempt) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 1) {
      f.error_tails[p.pid] = "torch.OutOfMemoryError: CUDA out of memory.\n";
      f.ExitAfter(p.pid, seconds(1), 1);
    }
  };
  ::testing::internal::CaptureStdout();  // spdlog's lines
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/5), 1);
  const std::string err = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(h.procs.groups_started(), 2) << err;
  EXPECT_NE(err.find("rank 1 failed the same way twice (cuda_oom before its first step): not "
                     "restarting"),
            std::string::npos) << err;
  EXPECT_NE(err.find("cuda_oom: the GPU ran out of memory: try a smaller batch"),
            std::string::npos) << err;
}

// The step named is the last one the rank reported (the failure came in the one after it):
// "at step 119" read as a contradiction of an error that said step 120.
TEST(AgentRootCause, ARepeatedFailureNamesTheLastReportedStepAsSuch) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    StepRecord step;
    step.samples = 1;
    step.step_s = 0.1;
    f.StepsEvery(p.pid, milliseconds(100), milliseconds(11900), step);  // steps 1..119
    if (p.spec.local_rank == 1) {
      f.error_tails[p.pid] = "torch.OutOfMemoryError: CUDA out of memory (in step 120).\n";
      f.ExitAfter(p.pid, milliseconds(11950), 1);
    }
  };
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/5), 1);
  const std::string err = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(err.find("rank 1 failed the same way twice (cuda_oom after step 119, its last "
                     "reported): not restarting"),
            std::string::npos) << err;
  EXPECT_EQ(err.find("at step 119"), std::string::npos) << err;
}

TEST(RootCause, ErrorFilesAreReadInTorchelasticsFormat) {
  MemoryFileSystem fs;
  const std::string d = "/rc";
  WriteErrorFile(fs, d + "/e.json", "boom", 12.5);
  ErrorRecord r = ReadErrorRecord(fs, d + "/e.json");
  EXPECT_EQ(r.message, "boom");
  EXPECT_DOUBLE_EQ(r.timestamp, 12.5);
  ASSERT_TRUE(fs.Write(d + "/bad.json", "{not json").ok());
  EXPECT_NE(ReadErrorRecord(fs, d + "/bad.json").message.find("unreadable error file"),
            std::string::npos);
  EXPECT_TRUE(ReadErrorRecord(fs, d + "/missing.json").message.empty());
}

TEST(AgentRootCause, TheAgentExitsWithTheRootCausesCodeNotTheFirstExit) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    const std::string err = p.spec.env.at("TORCHELASTIC_ERROR_FILE");
    if (p.spec.local_rank == 0) {  // recorded its error first, exits second with 2
      WriteErrorFile(f.files, err, "rank 0 failed first", 100.0);
      f.ExitAfter(p.pid, seconds(2), 2);
    } else {  // exits first with 3, its error file is later
      WriteErrorFile(f.files, err, "rank 1 failed later", 200.0);
      f.ExitAfter(p.pid, seconds(2), 3);
    }
  };
  EXPECT_EQ(h.RunStatic(0), 2);
}

// The failure block names each failure's class, the advice follows, and --report-json lists
// the root cause of every failed attempt with its class.
TEST(AgentRootCause, EachFailureIsClassifiedInTheBlockAndTheReport) {
  Harness h(2);
  h.options.telemetry.report_json = h.options.run_dir + "/report.json";
  h.options.keep_run_dir = true;
  h.procs.facts_said.oom_kills = 4;
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.attempt == 0 && p.spec.local_rank == 1) {
      f.error_tails[p.pid] = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory.\n";
      f.ExitAfter(p.pid, seconds(1), 1);
    }
    if (p.attempt == 1 && p.spec.local_rank == 0) {
      f.facts_said.oom_kills = 5;  // the kernel's OOM killer took this one
      f.KilledAfter(p.pid, seconds(1), SIGKILL);
    }
  };
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(h.RunStatic(/*max_restarts=*/1), 128 + SIGKILL);
  const std::string block = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(block.find("  class     : host_oom\n"), std::string::npos) << block;
  const std::string json = h.procs.files.Read(h.options.telemetry.report_json).value_or("");
  EXPECT_NE(json.find("\"class\": \"cuda_oom\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"class\": \"host_oom\""), std::string::npos) << json;
  EXPECT_LT(json.find("cuda_oom"), json.find("host_oom"));  // in the order they happened
}

TEST(AgentRootCause, ASignalDeathIsReportedAs128PlusTheSignal) {
  Harness h(2);
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 1) f.KilledAfter(p.pid, seconds(1), SIGSEGV);
  };
  EXPECT_EQ(h.RunStatic(0), 128 + SIGSEGV);
}

TEST(RootCause, TheFailureBlockHasTorchrunsShape) {
  std::vector<WorkerExit> exits = {{1, 5, 101, 0, SIGKILL, 1.7e9, false},
                                   {0, 4, 100, 3, 0, 1.7e9 + 1, false}};
  auto errors = [](int lr) {
    return lr == 0 ? ErrorRecord{"ValueError: bad", 1.6e9, "Traceback (most recent call last):"}
                   : ErrorRecord{};
  };
  FailureReport r{"train.py", "node7", exits, PickRootCause(exits, errors),
                  [](int lr) { return "/logs/attempt_0/" + std::to_string(lr) + "/error.json"; },
                  errors};
  const std::string block = FormatFailureReport(r);
  EXPECT_NE(block.find("train.py FAILED\n"), std::string::npos) << block;
  const size_t root = block.find("Root Cause (first observed failure):\n[0]:\n");
  ASSERT_NE(root, std::string::npos) << block;
  const std::string root_part = block.substr(root);
  EXPECT_NE(root_part.find("  host      : node7\n"), std::string::npos) << block;
  EXPECT_NE(root_part.find("  rank      : 4 (local_rank: 0)\n"), std::string::npos) << block;
  EXPECT_NE(root_part.find("  exitcode  : 3 (pid: 100)\n"), std::string::npos) << block;
  EXPECT_NE(root_part.find("  error_file: /logs/attempt_0/0/error.json\n"), std::string::npos);
  EXPECT_NE(root_part.find("  traceback : Traceback (most recent call last):"), std::string::npos);
  // The other failure, killed by a signal, without an error file, as torchrun shows it.
  const std::string others = block.substr(0, root);
  EXPECT_NE(others.find("  exitcode  : -9 (pid: 101)\n"), std::string::npos) << block;
  EXPECT_NE(others.find("  error_file: <N/A>\n"), std::string::npos) << block;
  EXPECT_NE(others.find("  traceback : Signal 9 (SIGKILL) received by PID 101\n"),
            std::string::npos) << block;
}

TEST(AgentRootCause, LikeTorchrunDlrunExitsWithOneUnlessAskedForTheWorkersCode) {
  Harness h(1);
  h.options.exit_with_worker_code = false;
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, seconds(1), 7);
  };
  EXPECT_EQ(h.RunStatic(0), 1);
}


TEST(RootCause, HardwareFaultsPointAtTheNodeNotTheProgram) {
  const WorkerExit segv{.local_rank = 0, .pid = 1, .signal = SIGSEGV};
  const WorkerExit exit1{.local_rank = 0, .pid = 1, .exit_code = 1};
  auto fault = [](const WorkerExit& e, std::string_view text, bool oom = false) {
    return HardwareFault(ClassifyFailure(e, text, oom), text);
  };
  EXPECT_EQ(fault(exit1, "RuntimeError: CUDA error: unspecified launch failure"),
            "a CUDA error the device caused");
  EXPECT_EQ(fault(exit1, "CUDA error: uncorrectable ECC error encountered"),
            "a GPU fault (ECC, XID, NVLink or a lost GPU)");
  // The program's own bugs.
  EXPECT_EQ(fault(exit1, "RuntimeError: CUDA error: an illegal memory access was encountered"),
            "");
  EXPECT_EQ(fault(exit1, "RuntimeError: CUDA error: device-side assert triggered"), "");
  EXPECT_EQ(fault(segv, "#0 0x7f in ?? () from /usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            "a segfault in a CUDA library");
  EXPECT_EQ(fault({.local_rank = 0, .pid = 1, .signal = SIGKILL}, "", /*oom=*/true),
            "the host's OOM killer");
  EXPECT_EQ(fault(exit1, "torch.OutOfMemoryError: CUDA out of memory."), "");  // the batch
  EXPECT_EQ(fault(segv, "#0 in my_kernel () at train.cc:12"), "");             // the program
  EXPECT_EQ(fault(exit1, "ValueError: bad input"), "");
}

// Two hardware faults on this node put it in the bad-node lists, once.
TEST(AgentRootCause, TwoHardwareFaultsPutTheNodeInTheBadNodeList) {
  Harness h(2);
  h.options.bad_nodes_files = {"/home/u/.cache/dlrun/bad_nodes.tsv"};
  h.options.hostname = "gpu07";
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 1 && p.attempt < 3) {
      f.error_tails[p.pid] = "RuntimeError: CUDA error: unspecified launch failure\n";
      f.ExitAfter(p.pid, seconds(1), 1);
    }
  };
  ::testing::internal::CaptureStdout();
  h.RunStatic(/*max_restarts=*/1);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const auto bad = ReadBadNodes(h.procs.files, h.options.bad_nodes_files[0]);
  ASSERT_EQ(bad.size(), 1u) << out;
  EXPECT_EQ(bad[0].host, "gpu07");
  EXPECT_EQ(bad[0].reason,
            "workers failed twice with a hardware fault, the last a CUDA error the device caused");
  EXPECT_NE(out.find("goes into the bad-node list: its workers failed twice with a hardware "
                     "fault, the last a CUDA error the device caused"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace dlrun::launcher::testing
