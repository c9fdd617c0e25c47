#include "launcher/cli/node_cli.h"

#include "absl/strings/str_cat.h"
#include "common/defaults.h"

namespace dlrun::launcher {
namespace {

std::vector<cli::Flag<PreflightArgs>> PreflightFlags() {
  return {
      {"preflight", "", true,
       [](PreflightArgs& a, const std::string& v) {
         auto m = ParsePreflightMode(v);
         if (!m.ok()) return m.status();
         if (*m == PreflightMode::kOff) {
           return absl::InvalidArgumentError(
               "--preflight 'off': `dlrun preflight` runs the checks (expected quick or full)");
         }
         a.mode = *m;
         return absl::OkStatus();
       },
       absl::StrCat("quick (default: the compute probe for ",
                    defaults::kPreflightQuick.count() / 1000.0, " s) or full (",
                    defaults::kPreflightFull.count() / 1000, " s)")},
      {"gpus", "", true, cli::IntField("gpus", &PreflightArgs::gpus, 0, 1024),
       "the GPUs the job needs on this node (default 0: not checked)"},
      {"checkpoint-dir", "", true, cli::StrField(&PreflightArgs::checkpoint_dir),
       "the directory whose free space is checked (default .)"},
      {"record", "", false, cli::BoolField(&PreflightArgs::record),
       "a node that fails a check goes into the bad-node list (`dlrun bad-nodes`)"},
  };
}

std::vector<cli::Flag<BadNodesArgs>> BadNodesFlags() {
  return {
      {"clear", "", false, cli::BoolField(&BadNodesArgs::clear),
       "remove the HOSTs named after the flags (none: every host) from the list"},
      {"add", "", true, cli::StrField(&BadNodesArgs::add), "add HOST to the list (with --reason)"},
      {"reason", "", true, cli::StrField(&BadNodesArgs::reason), "why --add's host is bad"},
  };
}

}  // namespace

absl::StatusOr<PreflightArgs> ParsePreflightArgs(const std::vector<std::string>& args) {
  PreflightArgs a;
  auto parsed = cli::ParseCommand(cli::ParseSpec{"dlrun preflight", /*wants_program=*/false},
                                  PreflightFlags(), args, a);
  if (!parsed.ok()) return parsed.status();
  return a;
}

std::string PreflightUsage() {
  return cli::Usage(
      "usage: dlrun preflight [options]\n"
      "The checks a multi-node job runs on each node before it joins (--preflight): the GPUs\n"
      "NVML sees and their health (uncorrected ECC errors, retired pages or row remaps pending),\n"
      "the free space of the checkpoint directory, and a compute probe (GFLOP/s on one core,\n"
      "which the rendezvous compares across the round). One line per check; exit 1 when one\n"
      "fails.\n",
      PreflightFlags());
}

absl::StatusOr<BadNodesArgs> ParseBadNodesArgs(const std::vector<std::string>& args) {
  BadNodesArgs a;
  cli::ParseSpec spec{"dlrun bad-nodes", /*wants_program=*/true};  // the hosts --clear takes
  spec.program_optional = true;
  auto parsed = cli::ParseCommand(spec, BadNodesFlags(), args, a);
  if (!parsed.ok()) return parsed.status();
  if (!a.command.empty() && !a.clear) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dlrun bad-nodes: unexpected argument '", a.command[0], "' (hosts follow --clear)"));
  }
  if (a.clear && !a.add.empty()) {
    return absl::InvalidArgumentError("dlrun bad-nodes: --clear and --add together (one at a time)");
  }
  if (!a.add.empty() && a.reason.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dlrun bad-nodes: --add ", a.add, " without --reason (say why it is bad)"));
  }
  return a;
}

std::string BadNodesUsage() {
  return cli::Usage(
      "usage: dlrun bad-nodes [--clear [HOST...]] [--add HOST --reason TEXT]\n"
      "The nodes this user's jobs found bad (left out by the preflight, or whose workers failed\n"
      "twice with a hardware fault), with the reason and the time; `dlrun slurm` excludes them\n"
      "and `dlrun runai` keeps pods off them. The list: ~/.cache/dlrun/bad_nodes.tsv\n"
      "($XDG_CACHE_HOME/dlrun when set).\n",
      BadNodesFlags());
}

}  // namespace dlrun::launcher
