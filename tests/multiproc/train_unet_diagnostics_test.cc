// train_unet under the diagnostics: the real perf over a step range, NVTX ranges and nsys's
// capture window, and `dlrun stacks` reading native frames (docs/PROFILING.md, docs/STACKS.md).
#include <signal.h>

#include <algorithm>
#include <regex>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...


namespace dlrun::testing {
namespace {

// --profile perf on a C++ trainer (docs/PROFILING.md): the real perf attached to rank 0 only,
// enabled from the end of step 4 to the end of step 10 through its control fifo.
TEST(TrainUnet, PerfProfilesTheStepRangeOfRankZeroAndItsFlameGraphNamesTheConvolutions) {
  const std::string tmp = MakeTempDir();
  const std::string report = tmp + "/report.json";
  ProcResult r = RunCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--log-dir",
                             tmp + "/logs", "--report-json", report, "--profile", "perf",
                             "--profile-ranks", "0", "--profile-steps", "5:10", TRAIN_UNET_BIN,
                             "--synthetic", "--base-channels", "8", "--data-size", "64",
                             "--max-steps", "16"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(240));
  if (r.exit_code == 2 && (r.output.find("perf events are not allowed") != std::string::npos ||
                           r.output.find("perf is not installed") != std::string::npos)) {
    GTEST_SKIP() << r.output;
  }
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(ReadFile(report));
  ASSERT_EQ(j["profiles"].size(), 1u) << j["profiles"].dump() << r.output;
  const std::string svg_path = j["profiles"]["0"].get<std::string>();
  const std::string svg = ReadFile(svg_path);
  // The 3-D convolutions' ATen frames (at::native::_convolution under conv3d, and
  // convolution_backward): DWARF call chains reach them from the oneDNN kernels; conv3d's own
  // frame is further out, in the few forward samples whose 32 KB of stack reach it.
  EXPECT_NE(svg.find("at::native::convolution_backward"), std::string::npos);
  EXPECT_NE(svg.find("convolution"), std::string::npos);
  // Only steps 5-10: about 99 samples a second of rank 0's one busy thread over six steps, far
  // fewer than over the whole run (start-up and 16 steps).
  int64_t samples = 0;
  std::string folded = ReadFile(svg_path.substr(0, svg_path.size() - 4) + ".folded");
  for (absl::string_view line : absl::StrSplit(folded, '\n', absl::SkipEmpty())) {
    int64_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &n)) << line;
    samples += n;
  }
  const double p95 = j["ranks"]["0"]["step_time_p95_s"].get<double>();
  EXPECT_GE(samples, 10) << folded;
  EXPECT_LE(samples, 99 * (6 * p95 * 1.5 + 0.2)) << "p95 step " << p95 << " s";
  EXPECT_TRUE(std::regex_search(r.output, std::regex("rank 0 \\([0-9]+ samples\\): ")))
      << "the report names the hot frames";
  std::filesystem::remove_all(tmp);
}

#ifdef HAVE_NVTX_RECORD_LIB
// One event of tests/worker/nvtx_record.cc's log: its kind, thread or range id, and name.
struct NvtxEvent {
  std::string kind;  // push, pop, start, end, cudaProfilerStart, cudaProfilerStop
  std::string who;   // the thread (push, pop) or the range id (start, end)
  std::string name;  // with its payload, e.g. "step 2"
};

std::vector<NvtxEvent> ReadNvtxLog(const std::string& path) {
  std::vector<NvtxEvent> events;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    std::vector<std::string> w = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    events.push_back({w[0], w.size() > 1 ? w[1] : "", w.size() > 2 ? w[2] : ""});
  }
  return events;
}

size_t IndexOf(const std::vector<NvtxEvent>& ev, const std::string& kind, const std::string& name,
               size_t from = 0) {
  for (size_t i = from; i < ev.size(); ++i) {
    if (ev[i].kind == kind && ev[i].name == name) return i;
  }
  return ev.size();
}

// The pop that closes the push at `open` (same thread, same depth).
size_t MatchingPop(const std::vector<NvtxEvent>& ev, size_t open) {
  int depth = 0;
  for (size_t i = open; i < ev.size(); ++i) {
    if (ev[i].who != ev[open].who) continue;
    if (ev[i].kind == "push") ++depth;
    if (ev[i].kind == "pop" && --depth == 0) return i;
  }
  return ev.size();
}

// NVTX ranges (dlrun/nvtx_ranges.h) through a real NVTX tool interface: our injection library
// records the "dlrun" domain. Rank 1 also runs under --profile nsys (the stub) with steps 2:3, and
// the same library stands in for cudaProfilerStart/Stop.
TEST(TrainUnet, OneStepEmitsItsNvtxRangesInOrderAndNsysCapturesOnlyTheStepRange) {
  const std::string tmp = MakeTempDir();
  std::filesystem::create_directories(tmp + "/nvtx");
  ProcResult r = RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", "--log-dir", tmp + "/logs", "--profile",
       "nsys", "--profile-ranks", "1", "--profile-steps", "2:3", TRAIN_UNET_BIN, "--synthetic",
       "--base-channels", "4", "--data-size", "64", "--max-steps", "5", "--checkpoint-dir",
       tmp + "/ckpt", "--checkpoint-every", "4"},
      {{"OMP_NUM_THREADS", "1"}, {"NVTX_INJECTION64_PATH", NVTX_RECORD_LIB},
       {"LD_PRELOAD", NVTX_RECORD_LIB}, {"NVTX_RECORD_DIR", tmp + "/nvtx"},
       {"DLRUN_NSYS", std::string(SOURCE_DIR) + "/tests/multiproc/nsys_stub.sh"},
       {"NSYS_STUB_LOG", tmp + "/nsys.log"}},
      std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string nsys = ReadFile(tmp + "/nsys.log");
  EXPECT_EQ(std::count(nsys.begin(), nsys.end(), '\n'), 1) << nsys;
  EXPECT_EQ(nsys.rfind("RANK=1 DLRUN_PROFILE_STEPS=2:3 profile -o ", 0), 0u) << nsys;
  EXPECT_NE(nsys.find("--capture-range=cudaProfilerApi --capture-range-end=stop -- "),
            std::string::npos) << nsys;

  int logs = 0, captured = 0, saves = 0;
  for (const auto& f : std::filesystem::directory_iterator(tmp + "/nvtx")) {
    const std::vector<NvtxEvent> ev = ReadNvtxLog(f.path());
    const size_t step = IndexOf(ev, "push", "step 2");
    if (step == ev.size()) continue;  // a process with no training steps
    ++logs;
    SCOPED_TRACE(f.path().string());
    const size_t step_end = MatchingPop(ev, step);
    ASSERT_LT(step_end, ev.size());
    // The step's own ranges on its thread, in order, each closed before the next opens.
    std::vector<std::string> inside;
    size_t backward = 0, backward_end = 0, optimizer = 0;
    for (size_t i = step + 1; i < step_end; ++i) {
      if (ev[i].kind != "push" || ev[i].who != ev[step].who) continue;
      const size_t end = MatchingPop(ev, i);
      if (ev[i].name == "backward") backward = i, backward_end = end;
      if (ev[i].name == "optimizer step") optimizer = i;
      if (ev[i].name != "broadcast buffers") inside.push_back(ev[i].name);
      i = end;
    }
    EXPECT_EQ(inside, (std::vector<std::string>{"data wait", "forward", "backward", "optimizer step"}));
    // Each bucket's all-reduce: started during backward, in bucket order, reduced before the
    // optimizer step.
    std::vector<std::string> buckets;
    for (size_t i = step; i < step_end; ++i) {
      if (ev[i].kind != "start") continue;
      buckets.push_back(ev[i].name);
      EXPECT_GT(i, backward);
      EXPECT_LT(i, backward_end);
      size_t end = i + 1;
      while (end < ev.size() && !(ev[end].kind == "end" && ev[end].who == ev[i].who)) ++end;
      EXPECT_LT(end, optimizer) << ev[i].name << " is still open at the optimizer step";
    }
    ASSERT_FALSE(buckets.empty());
    for (size_t b = 0; b < buckets.size(); ++b) {
      EXPECT_EQ(buckets[b], "allreduce bucket " + std::to_string(b));
    }
    // The checkpoint of step 4 (rank 0 writes it), after that step.
    const size_t save = IndexOf(ev, "push", "checkpoint save 4");
    if (save < ev.size()) {
      ++saves;
      EXPECT_GT(save, MatchingPop(ev, IndexOf(ev, "push", "step 4")));
    }
    // nsys's capture (rank 1 only): from the end of step 1 to the end of step 3.
    const size_t start = IndexOf(ev, "cudaProfilerStart", "");
    if (start == ev.size()) {
      EXPECT_EQ(IndexOf(ev, "cudaProfilerStop", ""), ev.size());
      continue;
    }
    ++captured;
    EXPECT_GT(start, MatchingPop(ev, IndexOf(ev, "push", "step 1")));
    EXPECT_LT(start, step);
    const size_t stop = IndexOf(ev, "cudaProfilerStop", "");
    EXPECT_GT(stop, MatchingPop(ev, IndexOf(ev, "push", "step 3")));
    EXPECT_LT(stop, IndexOf(ev, "push", "step 4"));
  }
  EXPECT_EQ(logs, 2) << "both ranks' ranges";
  EXPECT_EQ(captured, 1) << "only rank 1 captures";
  EXPECT_EQ(saves, 1) << "rank 0's checkpoint";
  std::filesystem::remove_all(tmp);
}
#endif

// `dlrun stacks` on a C++ trainer: native frames with symbols through eu-stack, and a rank
// stopped with SIGSTOP is read (eu-stack attaches to a stopped process) or named missing, within
// the bound (docs/STACKS.md).
TEST(TrainUnet, DlrunStacksReadsNativeFramesAndAStoppedRank) {
  const std::string tmp = MakeTempDir();
  Started job = StartCommand({DLRUN_BIN, "--standalone", "--nproc-per-node", "2", TRAIN_UNET_BIN,
                              "--synthetic", "--base-channels", "4", "--max-steps", "1000000"},
                             {{"TMPDIR", tmp}, {"OMP_NUM_THREADS", "1"}});
  ASSERT_TRUE(ReadUntil(job, "step 3/", 1, std::chrono::seconds(120))) << job.output;
  auto stacks = [&tmp] {
    ProcResult r = RunCommand({DLRUN_BIN, "stacks", "--json", "--timeout", "5"}, {{"TMPDIR", tmp}},
                              std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  };
  // A main thread caught inside oneDNN's JIT-generated kernels cannot be unwound past them (no
  // unwind tables there: one "??" frame), so the dump is taken again, a few times at most,
  // until a rank's main thread shows a frame of the trainer.
  nlohmann::json j;
  bool trainer_frame = false;
  for (int attempt = 0; attempt < 10 && !trainer_frame; ++attempt) {
    j = stacks();
    ASSERT_TRUE(j.is_object());
    for (const auto& g : j["groups"]) {
      for (const auto& f : g["frames"]) {
        // The trainer's own source line (with its debug information), or its function.
        const std::string frame = f.get<std::string>();
        trainer_frame |= frame.find("examples/unet/trainer.cc:") != std::string::npos ||
                         frame.find("TrainUnetMain") != std::string::npos;
      }
    }
  }
  EXPECT_TRUE(trainer_frame) << j.dump(1);
  int pid1 = -1;
  for (const auto& r : j["ranks"]) {
    EXPECT_EQ(r["tool"], "eu-stack") << r.dump();
    if (r["rank"] == 1) pid1 = r["pid"].get<int>();
    EXPECT_LT(r["pause_ms"].get<double>(), 5000.0);
  }
  ASSERT_GT(pid1, 0);
  ASSERT_EQ(kill(pid1, SIGSTOP), 0);
  const nlohmann::json stopped = stacks();
  kill(pid1, SIGCONT);
  ASSERT_TRUE(stopped.is_object());
  bool accounted = false;
  for (const auto& g : stopped["groups"]) {
    for (const auto& r : g["ranks"]) accounted |= r == 1;
  }
  for (const auto& m : stopped["missing"]) {
    if (m["rank"] == 1) accounted = !m["why"].get<std::string>().empty();
  }
  EXPECT_TRUE(accounted) << stopped.dump(1);
  EXPECT_LT(stopped["took_s"].get<double>(), 6.0);
  kill(job.pid, SIGTERM);
  FinishCommand(job, std::chrono::seconds(60));
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace dlrun::testing
