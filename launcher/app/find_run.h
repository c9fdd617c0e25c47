// The running job a `dlrun stacks` or `dlrun profile` is about, and a client to its rendezvous.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/cli/diagnose_cli.h"
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
