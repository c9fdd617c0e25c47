// The subcommands of the dlrun executable; launcher/main.cc dispatches to them. Each returns
// dlrun's exit code (2 for bad input, with a one-line error on stderr).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/base/self_path.h"  // SelfPath, which the subcommands use

namespace dlrun::launcher {

// `dlrun [options] PROGRAM ARGS` (env_only: `dlrun env [options]`, which prints what was
// detected and exits).
int LaunchMain(const std::vector<std::string>& args, bool env_only);
// `dlrun slurm [options] -- PROGRAM ARGS`: the sbatch script (stdout or -o), or submits it.
int SlurmMain(const std::vector<std::string>& args);
// `dlrun runai [options] -- PROGRAM ARGS`: the runai command line; -o FILE: the manifest too.
int RunaiMain(const std::vector<std::string>& args);
// `dlrun rdzv-server [options]`.
int RdzvServerMain(const std::vector<std::string>& args);
// `dlrun stacks [options]`: the stacks of a running job's workers (app/stacks_main.cc).
int StacksMain(const std::vector<std::string>& args);
// `dlrun preflight` and `dlrun bad-nodes` (app/node_main.cc).
int PreflightMain(const std::vector<std::string>& args);
int BadNodesMain(const std::vector<std::string>& args);
// `dlrun profile`: py-spy or perf on ranks of a running job (launcher/app/profile_main.cc).
int ProfileMain(const std::vector<std::string>& args);

// `dlrun --cmake-prefix-path`: the prefix whose lib/cmake/dlrun holds the worker library's CMake
// package (the wheel's or `cmake --install`'s), for CMAKE_PREFIX_PATH, as
// torch.utils.cmake_prefix_path is for Torch (docs/PACKAGING.md).
int CmakePrefixPathMain();

// `text` on stdout, exit 0: -h/--help of any subcommand (cli::Parsed::help), and what `dlrun
// env` and --print-completion print.
int Print(const std::string& text);
// Prints "dlrun: MESSAGE" on stderr and returns 2.
int Fail(const absl::Status& s);
// The same line, for what is not a usage error (a rendezvous host that does not resolve): exit 1.
int FailRun(const absl::Status& s);

}  // namespace dlrun::launcher
