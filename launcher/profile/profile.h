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
#include "launcher/base/profile_spec.h"

namespace dlrun::launcher {

// The file of rank R's profile in the profile directory: rank<R>.nsys-rep, .svg (py-spy and
// perf: the flame graph, with the raw capture beside it) or .pt.trace.json (torch).
std::string ProfileFileName(ProfileTool t, int rank);

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
