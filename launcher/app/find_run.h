// The running job a `dlrun stacks` or `dlrun profile` is about, and a client to its rendezvous.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "launcher/cli/flags.h"
#include "launcher/stacks/stacks.h"
#include "rendezvous/client.h"

namespace dlrun::launcher {

struct FoundRun {
  std::string run_dir;
  WorkersFile workers;
};

// The one live dlrun job on this machine: the run directory `log_dir` names (or the one among
// those it holds), else the runs registered in this machine's index; `run_id` picks among
// several. Errors in one line: a bad --log-dir (InvalidArgument), none (NotFound), several
// (FailedPrecondition, naming them).
absl::StatusOr<FoundRun> FindRun(const std::string& log_dir, const std::string& run_id);

// How a command names the job: --log-dir, --run-id/--rdzv-id, --rdzv-endpoint, --this-node.
struct JobChoice {
  std::string log_dir;
  std::string run_id;
  std::string rdzv_endpoint;  // a job elsewhere, with run_id
  bool this_node = false;
};

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
  flags->push_back({"run-id", "", true, str(&JobChoice::run_id),
                    "the job's run id (--rdzv-id), when several jobs run on this node"});
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

// Where the chosen job is reached: through its rendezvous (`endpoint`, `run_id`, `token`) for a
// job elsewhere or a multi-node one without --this-node, else on this node only (`run`).
struct JobTarget {
  std::string endpoint, run_id, token;  // endpoint empty: `run` alone
  std::optional<FoundRun> run;          // the job's run on this node (none for a job elsewhere)
};
// Errors in one line: InvalidArgument for flags or environment (exit 2), others when no job
// fits (exit 1).
absl::StatusOr<JobTarget> ChooseJob(const JobChoice& choice);

// A client to the rendezvous at `endpoint` of job `run_id` (TLS from the environment).
absl::StatusOr<std::unique_ptr<rdzv::RendezvousClient>> JobClient(const std::string& endpoint,
                                                                   const std::string& run_id,
                                                                   const std::string& token);

}  // namespace dlrun::launcher
