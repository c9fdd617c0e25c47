// What --profile asks for (docs/PROFILING.md): the tool, the global ranks, the steps and the
// tool's extra arguments, and their parsing from text (flags, and `dlrun profile`'s request on
// the wire). Plain values: cli/ fills them, profile/ and the agent act on them.
#pragma once

#include <cstdint>
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

}  // namespace dlrun::launcher
