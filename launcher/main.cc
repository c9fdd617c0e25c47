// dlrun: a torchrun-compatible launcher for distributed training. This file only dispatches;
// docs/ARCHITECTURE.md maps the components.
#include <cstdio>
#include <string>
#include <vector>

#include "launcher/app/commands.h"
#include "launcher/cli/options.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  namespace dl = dlrun::launcher;
  spdlog::set_pattern("[dlrun %H:%M:%S.%e] %^%l%$: %v");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {  // -h/--help is the subcommands' (cli::Parsed::help)
    std::fputs(dl::UsageText().c_str(), stderr);
    return 2;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "slurm") return dl::SlurmMain(rest);
  if (args[0] == "runai") return dl::RunaiMain(rest);
  if (args[0] == "rdzv-server") return dl::RdzvServerMain(rest);
  if (args[0] == "stacks") return dl::StacksMain(rest);
  if (args[0] == "profile") return dl::ProfileMain(rest);
  if (args[0] == "preflight") return dl::PreflightMain(rest);
  if (args[0] == "bad-nodes") return dl::BadNodesMain(rest);
  if (args[0] == "--cmake-prefix-path" && rest.empty()) return dl::CmakePrefixPathMain();
  if (args[0] == "env") return dl::LaunchMain(rest, /*env_only=*/true);
  return dl::LaunchMain(args, /*env_only=*/false);
}
