// Stack dumps (launcher/stacks/stacks.h): the tools' output parsed, ranks grouped by stack with
// the suspects named, the JSON and text reports, the workers file; and the agent's capture
// before kill, against the fake process table (when it dumps, what it writes, what it says).
#include <sys/syscall.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "launcher/stacks/stacks.h"
#include "nlohmann/json.hpp"
#include "agent/harness.h"
#include "tests/common/temp_dir.h"

namespace dlrun::launcher::testing {
namespace {

// What py-spy 0.4 prints for `dump --json`: threads in its own order, innermost frame first.
constexpr char kPySpyJson[] = R"([
  {"pid": 100, "thread_id": 1, "thread_name": "Thread-1", "os_thread_id": 102, "active": false,
   "owns_gil": false, "frames": [
     {"name": "<lambda>", "filename": "/w/sl.py", "short_filename": "sl.py", "line": 6}]},
  {"pid": 100, "thread_id": 2, "thread_name": "MainThread", "os_thread_id": 100, "active": false,
   "owns_gil": false, "frames": [
     {"name": "all_reduce", "filename": "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 4181},
     {"name": "main", "filename": "/w/train.py", "line": 45},
     {"name": "<module>", "filename": "/w/train.py", "line": 60}]}
])";

// eu-stack -s -m: the symbol version and the column are dropped, a frame without a symbol is
// named by its module.
constexpr char kEuStack[] = R"(PID 200 - process
TID 201:
#0  0x00007f0000000001 futex_wait - /usr/lib/x86_64-linux-gnu/libc.so.6
TID 200:
#0  0x00007faaae0ad503 clock_nanosleep@GLIBC_2.2.5 - /usr/lib/x86_64-linux-gnu/libc.so.6
    ../sysdeps/unix/sysv/linux/clock_nanosleep.c:71:10
#1  0x0000562cc71934af - /usr/bin/sleep
#2  0x0000562cc71934b0 dlrun::worker::Train(std::vector<int, std::allocator<int> > const&) - /w/build/bin/train_unet
    /w/examples/unet/trainer.cc:120
)";

// Without a stack (no py-spy), the call each main thread is blocked in: a futex wait waits on
// another thread (a collective's), a sleep or running is the rank's own work.
TEST(Stacks, WithoutStacksTheRankNotInAFutexWaitHoldsTheOthersUp) {
  const std::string futex = std::to_string(SYS_futex) + " 0x7f3a 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f3b";
  const std::string sleep = std::to_string(SYS_clock_nanosleep) + " 0x1 0x0 0x7ffd 0x0 0x0 0x0";
  EXPECT_EQ(HoldersBySyscall({{0, futex}, {1, sleep}, {2, futex}}), (std::vector<int>{1}));
  EXPECT_EQ(HoldersBySyscall({{0, futex}, {1, "running"}}), (std::vector<int>{1}));
  // Not told apart: every rank in a futex wait, or none; a rank not read counts for neither.
  EXPECT_TRUE(HoldersBySyscall({{0, futex}, {1, futex}}).empty());
  EXPECT_TRUE(HoldersBySyscall({{0, sleep}, {1, "running"}}).empty());
  EXPECT_TRUE(HoldersBySyscall({{0, sleep}, {1, ""}}).empty());
  EXPECT_EQ(HoldersBySyscall({{0, futex}, {1, ""}, {2, sleep}}), (std::vector<int>{2}));
}

TEST(Stacks, PySpysJsonIsReadWithTheMainThreadFirst) {
  auto threads = ParsePySpyJson(kPySpyJson, 100);
  ASSERT_TRUE(threads.ok()) << threads.status();
  ASSERT_EQ(threads->size(), 2u);
  EXPECT_EQ((*threads)[0].name, "MainThread");
  ASSERT_EQ((*threads)[0].frames.size(), 3u);
  EXPECT_EQ((*threads)[0].frames[1].Render(), "/w/train.py:45 main");
  EXPECT_EQ((*threads)[1].frames[0].Render(), "/w/sl.py:6 <lambda>");
  EXPECT_FALSE(ParsePySpyJson("Error: Failed to find python version", 100).ok());
  // Nulls and wrong types where strings and numbers belong are defaults, never a throw.
  auto nulls = ParsePySpyJson(R"([{"thread_name": null, "os_thread_id": 100, "frames": [
      {"name": null, "filename": 7, "line": "x"}, 5]}, 3, null])", 100);
  ASSERT_TRUE(nulls.ok());
  ASSERT_EQ(nulls->size(), 1u);
  EXPECT_EQ((*nulls)[0].name, "TID 100");
  EXPECT_EQ((*nulls)[0].frames[0].Render(), "??");
}

TEST(Stacks, EuStacksOutputIsReadWithSourceLinesWhereItHasThem) {
  auto threads = ParseEuStack(kEuStack, 200);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0].name, "TID 200");  // the main thread first, though listed second
  ASSERT_EQ(threads[0].frames.size(), 3u);
  EXPECT_EQ(threads[0].frames[0].Render(),
            "../sysdeps/unix/sysv/linux/clock_nanosleep.c:71 clock_nanosleep");
  EXPECT_EQ(threads[0].frames[1].Render(), "?? (sleep)");
  EXPECT_EQ(threads[0].frames[2].Render(), "/w/examples/unet/trainer.cc:120 dlrun::worker::Train(std::vector<int, "
            "std::allocator<int> > const&)");
  EXPECT_EQ(threads[1].frames[0].Render(), "futex_wait (libc.so.6)");
  EXPECT_TRUE(ParseEuStack("eu-stack: dwfl_linux_proc_report pid 9: No such file", 9).empty());
}

RankStack Rank(int rank, const std::string& host, std::vector<StackFrame> frames) {
  RankStack r;
  r.rank = rank;
  r.host = host;
  r.pid = 1000 + rank;
  r.tool = "py-spy";
  r.threads.push_back({"MainThread", std::move(frames)});
  return r;
}

StackFrame Frame(const std::string& function, const std::string& file, int line) {
  StackFrame f;
  f.function = function;
  f.file = file;
  f.line = line;
  return f;
}
const StackFrame kAllReduce = Frame(
    "all_reduce", "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 4181);
const StackFrame kMain45 = Frame("main", "/w/train.py", 45);
const StackFrame kSleep = Frame("stall", "/w/train.py", 18);

// eu-addr2line names a frame whose function was inlined "callee inlined at file:line:col in
// caller": the caller becomes a frame of its own after the callee (a train_unet rank in backward
// showed LibTorch's at::Tensor::backward and then libc, without the trainer's function).
TEST(Stacks, AnInlinedCallKeepsItsCallerAsAFrame) {
  const std::string dir = ::testing::TempDir() + "/addr2line_fake";
  std::filesystem::create_directories(dir);
  const std::string tool = dir + "/eu-addr2line";
  {
    std::ofstream f(tool);
    f << "#!/bin/sh\n"
         "echo 'at::Tensor::backward() const inlined at /w/examples/unet/trainer.cc:120:7 in "
         "TrainUnetMain(int, char**)'\n"
         "echo '/t/include/ATen/core/TensorBody.h:445:3'\n"
         "echo 'main'\n"
         "echo '/w/examples/unet/main.cc:9'\n";
  }
  std::filesystem::permissions(tool, std::filesystem::perms::owner_all);
  std::vector<RankStack> ranks(1);
  ranks[0].threads.resize(1);
  for (uint64_t offset : {0x10, 0x20}) {
    StackFrame f;
    f.function = "??";
    f.module = "/w/build/bin/train_unet";
    f.offset = offset;
    ranks[0].threads[0].frames.push_back(f);
  }
  SymbolizeStacks(&ranks, StackTools{"", "", tool}, std::chrono::seconds(10));
  const std::vector<StackFrame>& frames = ranks[0].threads[0].frames;
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].Render(),
            "/t/include/ATen/core/TensorBody.h:445 at::Tensor::backward() const");
  EXPECT_EQ(frames[1].Render(), "/w/examples/unet/trainer.cc:120 TrainUnetMain(int, char**)");
  EXPECT_EQ(frames[2].Render(), "/w/examples/unet/main.cc:9 main");
}

TEST(Stacks, RanksWithTheSameStackShareAGroupAndTheOddOnesAreSuspects) {
  std::vector<RankStack> ranks;
  for (int r : {0, 1, 3, 4, 5, 6, 7}) ranks.push_back(Rank(r, r < 4 ? "a" : "b", {kAllReduce, kMain45}));
  ranks.push_back(Rank(2, "a", {kSleep, kMain45}));
  RankStack gone;
  gone.rank = 8;
  gone.host = "b";
  gone.missing = "exited (no such process)";
  ranks.push_back(gone);
  const StackReport r = GroupStacks(ranks);
  ASSERT_EQ(r.groups.size(), 2u);
  EXPECT_EQ(r.groups[0].ranks, std::vector<int>({2}));  // smallest first
  EXPECT_EQ(r.groups[1].ranks, std::vector<int>({0, 1, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.groups[1].hosts, std::vector<std::string>({"a", "b"}));
  EXPECT_EQ(r.suspects, std::vector<int>({2}));
  const std::string text = FormatStackReport(r);
  EXPECT_NE(text.find("suspects: rank 2 "), std::string::npos) << text;
  EXPECT_NE(text.find("ranks 0-1,3-7 (node a, b):\n"), std::string::npos) << text;
  EXPECT_NE(text.find("    /w/train.py:18 stall\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 8 (node b, pid -1): not read: exited"), std::string::npos) << text;
  const auto j = nlohmann::json::parse(StackReportJson(r));
  EXPECT_EQ(j["suspects"], nlohmann::json({2}));
  EXPECT_EQ(j["groups"][0]["frames"][0], "/w/train.py:18 stall");
  EXPECT_EQ(j["missing"][0]["rank"], 8);
  EXPECT_EQ(j["missing"][0]["why"], "exited (no such process)");
  EXPECT_EQ(WhereTheOthersWere(r, 2), "the other 7 ranks were in all_reduce at train.py:45");
  EXPECT_NE(text.find("suspects: rank 2 (the stack differs from 7 other rank(s))"),
            std::string::npos) << text;
  // A suspect named elsewhere (the hang detection) whose stack was not read: no count of others
  // (it once said "differs from 18446744073709551615 other rank(s)").
  StackReport named = GroupStacks({gone});
  named.suspects = {1};
  const std::string said = FormatStackReport(named);
  EXPECT_NE(said.find("suspects: rank 1 (named by the hang detection, not by the stacks read)"),
            std::string::npos) << said;
  EXPECT_EQ(said.find("differs from"), std::string::npos) << said;
}

TEST(Stacks, OneStackHasNoSuspectsAndATieGoesToTheGroupWithTheLowestRank) {
  EXPECT_TRUE(GroupStacks({Rank(0, "a", {kMain45}), Rank(1, "a", {kMain45})}).suspects.empty());
  const StackReport tie = GroupStacks({Rank(0, "a", {kMain45}), Rank(1, "a", {kSleep})});
  EXPECT_EQ(tie.suspects, std::vector<int>({1}));
  EXPECT_TRUE(GroupStacks({}).groups.empty());
}

TEST(HangVerdict, TheRankOutsideACollectiveIsTheCulpritAndEveryRankIsPlaced) {
  const std::string dist = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py";
  std::vector<RankStack> ranks = {
      Rank(0, "a", {Frame("all_reduce", dist, 2800), Frame("main", "/job/hang.py", 12)}),
      Rank(1, "a", {Frame("main", "/job/hang.py", 10)}),
      Rank(2, "a", {Frame("all_reduce", dist, 2800), Frame("main", "/job/hang.py", 12)})};
  HangVerdict v = NameHung(GroupStacks(ranks), {});
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.where, "rank 1 is in main at hang.py:10; ranks 0,2 wait in all_reduce at hang.py:12");
  // Rank 0 is the odd one out by stack, rank 1 by what it does: the verdict goes by the latter.
  ranks = {Rank(0, "a", {Frame("main", "/job/hang.py", 10)}),
           Rank(1, "a", {Frame("all_reduce", dist, 2800), Frame("main", "/job/hang.py", 12)})};
  EXPECT_EQ(NameHung(GroupStacks(ranks), {}).culprits, std::vector<int>{0});
  // A native wait (train_unet's all-reduce) counts as one; a stopped rank is a culprit whatever
  // its stack says.
  ranks = {Rank(0, "a", {Frame("dlrun::worker::ShmAllreduce::Run", "shm_allreduce.cc", 90)}),
           Rank(1, "a", {Frame("dlrun::worker::ShmAllreduce::Run", "shm_allreduce.cc", 90)})};
  v = NameHung(GroupStacks(ranks), {1});
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_NE(v.where.find("rank 1 is stopped by a signal"), std::string::npos) << v.where;
  EXPECT_FALSE(v.all_wait);
  // Stacks that could not be read say why, so the idle line says what to install.
  RankStack unread;
  unread.rank = 2;
  unread.missing = "a Python worker, and no py-spy next to its interpreter or on PATH (pip install "
                   "'dlrun[tools]' or py-spy, or set DLRUN_PY_SPY)";
  std::vector<RankStack> with_unread = {
      Rank(0, "a", {Frame("all_reduce", dist, 2800), Frame("main", "/job/hang.py", 12)}), unread};
  EXPECT_NE(NameHung(GroupStacks(with_unread), {}).where.find(
                "rank 2: stack not read (a Python worker, and no py-spy next to its interpreter "
                "or on PATH (pip install 'dlrun[tools]' or py-spy"),
            std::string::npos)
      << NameHung(GroupStacks(with_unread), {}).where;
  // Every rank waits: nobody to name (the one holding them up is elsewhere, or gone).
  v = NameHung(GroupStacks(ranks), {});
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_TRUE(v.all_wait);
}

TEST(Stacks, NodesDumpsTravelAsJsonAndComeBackTheSame) {
  std::vector<RankStack> ranks = {Rank(3, "b", {kAllReduce, kMain45})};
  ranks[0].pause_ms = 12.5;
  auto back = RankStacksFromJson(RankStacksJson(ranks));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].host, "b");
  EXPECT_EQ((*back)[0].pause_ms, 12.5);
  EXPECT_EQ((*back)[0].threads[0].frames[1].Render(), "/w/train.py:45 main");
  // A whole report's JSON is read too (its "ranks").
  EXPECT_EQ(RankStacksFromJson(StackReportJson(GroupStacks(ranks)))->size(), 1u);
  EXPECT_FALSE(RankStacksFromJson("[{\"rank\": \"x\"}]").ok());
  EXPECT_FALSE(RankStacksFromJson("[{\"rank\": 99999999999}]").ok());
  auto odd = RankStacksFromJson(R"([{"rank": 1, "host": null, "pid": "x", "threads": [null,
      {"name": 3, "frames": [{"function": null, "line": 1e99}]}]}])");
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ((*odd)[0].pid, -1);
  EXPECT_EQ((*odd)[0].threads[0].frames[0].Render(), "??");
  EXPECT_FALSE(RankStacksFromJson("not json").ok());
}

TEST(Stacks, RankRangesAndTheCaptureModeAndTheWorkersFile) {
  EXPECT_EQ(RankRanges({7, 0, 1, 2, 4, 6}), "0-2,4,6-7");
  EXPECT_EQ(RankRanges({}), "");
  EXPECT_EQ(*ParseCaptureMode("always"), CaptureMode::kAlways);
  EXPECT_FALSE(ParseCaptureMode("sometimes").ok());
  const std::string d = dlrun::testing::MakeTempDir("wf");
  ASSERT_TRUE(WriteWorkersFile(PosixFileSystem(), d, {"job", "node-a", 42, 3, {{4, 0, 100}, {5, 1, 101}},
                                   "host-a:29400", "the-token"})
                  .ok());
  // It holds the job's token: its owner's alone.
  EXPECT_EQ(std::filesystem::status(d + "/" + kWorkersFileName).permissions() &
                std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto w = ReadWorkersFile(d + "/" + kWorkersFileName);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->run_id, "job");
  EXPECT_EQ(w->agent_pid, 42);
  EXPECT_EQ(w->attempt, 3);
  EXPECT_EQ(w->rdzv_endpoint, "host-a:29400");
  EXPECT_EQ(w->rdzv_token, "the-token");
  ASSERT_EQ(w->workers.size(), 2u);
  EXPECT_EQ(w->workers[1].rank, 5);
  EXPECT_EQ(w->workers[1].pid, 101);
  std::ofstream(d + "/bad.json") << "{\"workers\": 3}";
  EXPECT_FALSE(ReadWorkersFile(d + "/bad.json").ok());
  std::filesystem::remove_all(d);
}

// The agent's side: which failures it dumps before the stop, and what it keeps of the dump.
struct Capture {
  int calls = 0;
  std::vector<int> ranks;  // the last call's
};

void ArmCapture(Harness& h, Capture* c) {
  h.options.dump_stacks = [c](const std::vector<DumpTarget>& targets, Millis) {
    ++c->calls;
    c->ranks.clear();
    std::vector<RankStack> out;
    for (const DumpTarget& t : targets) {
      c->ranks.push_back(t.rank);
      out.push_back(Rank(t.rank, "node", {kAllReduce, kMain45}));
    }
    return out;
  };
}

TEST(AgentCapture, ACrashBySignalIsDumpedBeforeTheStopAndKeptInTheAttemptAndTheReport) {
  Harness h(3);
  Capture c;
  ArmCapture(h, &c);
  h.options.telemetry.report_json = h.options.run_dir + "/report.json";
  h.options.keep_run_dir = true;
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    if (p.spec.local_rank == 1) f.KilledAfter(p.pid, seconds(1), SIGSEGV);
  };
  EXPECT_EQ(h.RunStatic(0), 128 + SIGSEGV);
  EXPECT_EQ(c.calls, 1);
  EXPECT_EQ(c.ranks, std::vector<int>({0, 2}));  // the live ones, not the dead rank
  EXPECT_TRUE(h.procs.files.Read(h.options.run_dir + "/attempt_0/stacks.json").ok());
  const auto report =
      nlohmann::json::parse(h.procs.files.Read(h.options.telemetry.report_json).value_or(""));
  EXPECT_EQ(report["failures"][0]["class"], "segfault");
  EXPECT_EQ(report["failures"][0]["stacks"]["groups"][0]["ranks"], nlohmann::json({0, 2}));
}

TEST(AgentCapture, AutoSkipsAnExceptionWithItsTracebackAlwaysDoesNotAndOffNever) {
  auto run = [](CaptureMode mode, bool traceback) {
    Harness h(2);
    Capture c;
    ArmCapture(h, &c);
    h.options.capture_before_kill = mode;
    h.procs.on_spawn = [traceback](FakeProcesses& f, FakeProcesses::Proc& p) {
      if (p.spec.local_rank != 1) return;
      if (traceback) {
        (void)f.files.Write(
            p.spec.env.at("TORCHELASTIC_ERROR_FILE"),
            R"({"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": )"
            R"("Traceback (most recent call last): ...", "timestamp": "5"}}})");
      }
      f.ExitAfter(p.pid, seconds(1), 1);
    };
    h.RunStatic(0);
    return c.calls;
  };
  EXPECT_EQ(run(CaptureMode::kAuto, /*traceback=*/true), 0);
  EXPECT_EQ(run(CaptureMode::kAuto, /*traceback=*/false), 1);  // nothing says where it was
  EXPECT_EQ(run(CaptureMode::kAlways, /*traceback=*/true), 1);
  EXPECT_EQ(run(CaptureMode::kOff, /*traceback=*/false), 0);
}

}  // namespace
}  // namespace dlrun::launcher::testing
