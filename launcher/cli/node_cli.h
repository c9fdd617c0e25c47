// The command lines of `dlrun preflight` and `dlrun bad-nodes` (docs/USAGE.md "Preflight and bad
// nodes"): parsed here, as every flag is in cli/, and carried out by app/node_main.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/base/preflight.h"
#include "launcher/cli/flags.h"

namespace dlrun::launcher {

struct PreflightArgs : cli::CommandLine {
  PreflightMode mode = PreflightMode::kQuick;  // --preflight quick|full (off is refused)
  int gpus = 0;                                // --gpus N: the GPUs the job needs here
  std::string checkpoint_dir = ".";
  bool record = false;  // --record: a failing node goes into the bad-node list
};
absl::StatusOr<PreflightArgs> ParsePreflightArgs(const std::vector<std::string>& args);
std::string PreflightUsage();

struct BadNodesArgs : cli::CommandLine {  // command: the hosts --clear takes (none: all)
  bool clear = false;
  std::string add;     // --add HOST
  std::string reason;  // --reason TEXT, with --add
};
absl::StatusOr<BadNodesArgs> ParseBadNodesArgs(const std::vector<std::string>& args);
std::string BadNodesUsage();

}  // namespace dlrun::launcher
