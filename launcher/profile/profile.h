// Per-rank profiling (docs/PROFILING.md): which tool profiles which global ranks over which
// steps (`--profile TOOL --profile-ranks LIST [--profile-steps A:B] [--profile-args "..."]`),
// the wrapped command line of an nsys rank, and when the agent starts and stops a perf or py-spy
// capture from the step records it reads. Pure: the processes are in profiler.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::launcher {

// nsys wraps the rank (it cannot attach); perf and py-spy attach to the rank's process, whose
// command line stays as it was; torch is the PyTorch profiler, run by the Python helper
// (dlrun_report) in the rank itself.
enum class ProfileTool { kNone, kNsys, kPySpy, kPerf, kTorch };
absl::StatusOr<ProfileTool> ParseProfileTool(const std::string& v);
const char* ProfileToolName(ProfileTool t);
// The file of rank R's profile in the profile directory: rank<R>.nsys-rep, .svg (py-spy and
// perf: the flame graph, with the raw capture beside it) or .pt.trace.json (torch).
std::string ProfileFileName(ProfileTool t, int rank);

// --profile-steps A:B: the steps A to B, both included (as the program numbers them in its step
// records).
struct StepRange {
  int64_t first = 0, last = 0;
};
absl::StatusOr<StepRange> ParseStepRange(const std::string& v);

// "1", "0,2-3": distinct global ranks, ascending.
absl::StatusOr<std::vector<int>> ParseRankList(const std::string& flag, const std::string& v);

struct ProfileSpec {
  ProfileTool tool = ProfileTool::kNone;
  std::vector<int> ranks;           // global ranks; only these are profiled
  std::optional<StepRange> steps;   // none: the whole run of the rank
  std::vector<std::string> args;    // --profile-args, split as a shell would (no expansion)
  bool On() const { return tool != ProfileTool::kNone; }
  bool Wants(int rank) const;
};

// --profile-args: words split on blanks, with '...' and "..." quoting; an unterminated quote is
// an error naming the value.
absl::StatusOr<std::vector<std::string>> SplitProfileArgs(const std::string& v);

// The command line of an nsys-profiled rank: `nsys profile -o DIR/rank<R> --force-overwrite
// true [--capture-range=cudaProfilerApi --capture-range-end=stop] ARGS -- ARGV`.
std::vector<std::string> NsysArgv(const ProfileSpec& spec, const std::string& nsys,
                                  const std::string& out_stem, std::vector<std::string> argv);
// What a profiled rank's environment gets (contract.h: kProfile, kProfileSteps, kProfileFile):
// the tool, the steps ("A:B") and the torch trace's path. The worker library brackets the
// steps with cudaProfilerStart/Stop for nsys; the Python helper runs torch's profiler.
std::map<std::string, std::string> ProfileEnv(const ProfileSpec& spec, const std::string& file);

// When an attaching tool (perf, py-spy) captures, from the rank's step records: from the
// worker's start without a range, or with A = 0; else from the record of step A-1 (the end of
// the step before A) to the record of step B. Each record moves it forward; a rank restarted
// after the range was captured is not captured again.
class CaptureWindow {
 public:
  explicit CaptureWindow(std::optional<StepRange> steps) : steps_(steps) {}
  enum class Action { kNone, kStart, kStop };
  // The worker started (again).
  Action Started();
  // The worker reported `step`.
  Action Step(int64_t step);
  bool capturing() const { return capturing_; }
  // The range was captured to its end (a later attempt is not captured again).
  bool done() const { return done_; }

 private:
  std::optional<StepRange> steps_;
  bool capturing_ = false;
  bool done_ = false;
};

}  // namespace dlrun::launcher
