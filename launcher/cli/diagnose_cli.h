// The command lines of `dlrun stacks` (docs/STACKS.md) and `dlrun profile` (docs/PROFILING.md,
// "On a running job"): parsed here, as every flag is in cli/, and carried out by app/.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/defaults.h"
#include "launcher/cli/flags.h"

namespace dlrun::launcher {

// How a command names the job: --log-dir, --run-id/--rdzv-id, --rdzv-endpoint, --this-node.
struct JobChoice {
  std::string log_dir;
  std::string run_id;
  std::string rdzv_endpoint;  // a job elsewhere, with run_id
  bool this_node = false;
};

struct StacksArgs : cli::CommandLine {
  bool json = false;
  JobChoice job;
  std::chrono::milliseconds timeout = defaults::kStacksBound;
};
absl::StatusOr<StacksArgs> ParseStacksArgs(const std::vector<std::string>& args);
std::string StacksUsage();

struct ProfileArgs : cli::CommandLine {
  std::string ranks;      // as given
  std::vector<int> rank_list;  // parsed; not empty unless help or version
  std::chrono::milliseconds duration{10000};
  std::string tool = "py-spy";
  std::string args;
  bool json = false;
  JobChoice job;
};
// Errors in one line: a flag's, or --ranks missing or not a rank list.
absl::StatusOr<ProfileArgs> ParseProfileArgs(const std::vector<std::string>& args);
std::string ProfileUsage();

}  // namespace dlrun::launcher
