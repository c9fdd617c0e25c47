#include "launcher/cli/diagnose_cli.h"

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "launcher/base/profile_spec.h"

namespace dlrun::launcher {
namespace {

// Appends the flags that fill `A::*job`; `this_node_help` says what --this-node limits.
template <typename A>
void AddJobFlags(std::vector<cli::Flag<A>>* flags, JobChoice A::*job,
                 const std::string& this_node_help) {
  auto str = [job](std::string JobChoice::*field) {
    return [job, field](A& a, const std::string& v) {
      (a.*job).*field = v;
      return absl::OkStatus();
    };
  };
  flags->push_back({"log-dir", "", true, str(&JobChoice::log_dir),
                    "the job's run directory, or the --log-dir it was started with"});
  flags->push_back(
      {"run-id", "", true, str(&JobChoice::run_id),
       "the job's run id, when several jobs run on this node: the `run id` of "
       "dlrun's `restart 0:` line (a multi-node job's --rdzv-id; jobs started without one "
       "share torchrun's default `none`: pick those by --log-dir)"});
  flags->push_back({"rdzv-id", "", true, str(&JobChoice::run_id), "the same as --run-id"});
  flags->push_back({"rdzv-endpoint", "", true, str(&JobChoice::rdzv_endpoint),
                    absl::StrCat("HOST:PORT of a multi-node job's rendezvous, for a job that "
                                 "runs elsewhere (with --rdzv-id; the token from ",
                                 contract::kRdzvToken, ")")});
  flags->push_back({"this-node", "", false,
                    [job](A& a, const std::string&) {
                      (a.*job).this_node = true;
                      return absl::OkStatus();
                    },
                    this_node_help});
}

std::vector<cli::Flag<StacksArgs>> StacksFlags() {
  std::vector<cli::Flag<StacksArgs>> flags = {
      {"json", "", false, cli::BoolField(&StacksArgs::json),
       "print the groups, suspects and missing ranks as JSON"}};
  AddJobFlags(&flags, &StacksArgs::job,
              "only this node's workers, not every node's of a multi-node job");
  flags.push_back({"timeout", "", true, cli::DurationField("timeout", &StacksArgs::timeout, false),
                   absl::StrCat("seconds to wait for the dumps (default ",
                                defaults::kStacksBound.count() / 1000,
                                "); a rank or node not read by then is listed as missing")});
  return flags;
}

std::vector<cli::Flag<ProfileArgs>> ProfileFlags() {
  std::vector<cli::Flag<ProfileArgs>> flags = {
      {"ranks", "", true, cli::StrField(&ProfileArgs::ranks),
       "the global ranks to profile, e.g. 3 or 0,2-3 (required)"},
      {"duration", "", true, cli::DurationField("duration", &ProfileArgs::duration, false),
       "how long to sample, e.g. 10s (default 10s)"},
      {"tool", "", true, cli::StrField(&ProfileArgs::tool),
       "py-spy (Python workers) or perf (native ones; any process); default py-spy"},
      {"args", "", true, cli::StrField(&ProfileArgs::args), "more arguments for the tool"},
      {"json", "", false, cli::BoolField(&ProfileArgs::json),
       "print the profiles as --report-json does (\"profiles\", \"profile_details\")"},
  };
  AddJobFlags(&flags, &ProfileArgs::job, "only this node's workers, not the whole job's");
  return flags;
}

}  // namespace

absl::StatusOr<StacksArgs> ParseStacksArgs(const std::vector<std::string>& args) {
  StacksArgs a;
  auto parsed = cli::ParseCommand(cli::ParseSpec{"dlrun stacks", /*wants_program=*/false},
                                  StacksFlags(), args, a);
  if (!parsed.ok()) return parsed.status();
  return a;
}

std::string StacksUsage() {
  return cli::Usage(
      "usage: dlrun stacks [options]\n"
      "The current stacks of every worker of a running dlrun job, on every node of a multi-node\n"
      "one: ranks with the same stack share one entry, and the ranks whose stack differs are\n"
      "the suspects. Python workers are read with py-spy, native ones with eu-stack\n"
      "(docs/STACKS.md). The job is the one dlrun job on this node, or --run-id/--log-dir's,\n"
      "or --rdzv-endpoint/--rdzv-id's elsewhere.\n",
      StacksFlags());
}

absl::StatusOr<ProfileArgs> ParseProfileArgs(const std::vector<std::string>& args) {
  ProfileArgs a;
  auto parsed = cli::ParseCommand(cli::ParseSpec{"dlrun profile", /*wants_program=*/false},
                                  ProfileFlags(), args, a);
  if (!parsed.ok()) return parsed.status();
  if (a.help || a.version) return a;
  if (a.ranks.empty()) {
    return absl::InvalidArgumentError("dlrun profile needs --ranks (e.g. --ranks 3)");
  }
  auto ranks = ParseRankList("ranks", a.ranks);
  if (!ranks.ok()) return ranks.status();
  a.rank_list = *std::move(ranks);
  return a;
}

std::string ProfileUsage() {
  return cli::Usage(
      "usage: dlrun profile --ranks LIST [--duration 10s] [--tool py-spy|perf] [options]\n"
      "Attaches py-spy or perf to the listed ranks of a running dlrun job, on whichever node\n"
      "runs them, for --duration, and prints each rank's flame graph (an SVG on that node) and\n"
      "the frames it spent most time in (docs/PROFILING.md). nsys cannot attach to a running\n"
      "process: start the job with --profile nsys instead. The job is the one dlrun job on this\n"
      "node, or --run-id/--log-dir's, or --rdzv-endpoint/--rdzv-id's elsewhere.\n",
      ProfileFlags());
}

}  // namespace dlrun::launcher
