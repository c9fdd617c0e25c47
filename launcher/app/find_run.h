// The running job a `dlrun stacks` or `dlrun profile` is about, and a client to its rendezvous.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
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

// A client to the rendezvous at `endpoint` of job `run_id` (TLS from the environment).
absl::StatusOr<std::unique_ptr<rdzv::RendezvousClient>> JobClient(const std::string& endpoint,
                                                                   const std::string& run_id,
                                                                   const std::string& token);

}  // namespace dlrun::launcher
