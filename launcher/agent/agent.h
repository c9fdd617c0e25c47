// The local agent: starts this node's workers, supervises them in one event loop, restarts the
// group on failure as its membership source allows, forwards signals, and never leaves a
// worker behind. It is a thin loop: it watches, hands what happens to the parts that decide
// (InProcessRecovery over the RecoveryMachine, FailurePolicy for failures and hangs, the
// membership source for the job), and carries out their decisions through its seams. It reaches
// the operating system only through Processes and Clock, so tests drive it in-process with a
// fake process table and a fake clock (tests/launcher/agent/), and the POSIX side
// (posix_processes.h) is tested on its own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/assignment.h"
#include "launcher/agent/event_routes.h"
#include "launcher/agent/failure_policy.h"
#include "launcher/agent/membership.h"
#include "launcher/recovery/in_process_recovery.h"
#include "launcher/workers/agent_options.h"
#include "launcher/workers/agent_telemetry.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/diagnostics.h"
#include "launcher/workers/forensics.h"
#include "launcher/workers/processes.h"
#include "launcher/workers/run_dir.h"
#include "launcher/workers/worker_group.h"

namespace dlrun::launcher {

class Agent {
 public:
  // dlrun's exit code when a hang (hang_watch.h) ends the job.
  static constexpr int kHangExitCode = FailurePolicy::kHangExitCode;
  Agent(AgentOptions options, JobLink link, Processes& processes, Clock& clock);
  // Runs until the job ends; returns the exit code for dlrun: 0; 1 when workers failed (as
  // torchrun; with exit_with_worker_code the root cause's own code, 128+N for a signal); 1 when
  // the rendezvous stopped the job; kHangExitCode after a hang; 128+N if dlrun itself got
  // forwarded signal N.
  int Run();

 private:
  // How one attempt's supervision ended.
  struct Watch {
    enum class Outcome { kSucceeded, kFailed, kHung, kSignalled, kRestart, kStop, kUnrecovered };
    Outcome outcome;
    // kRestart, kStop: the rendezvous' reason; kHung: why it hung; kUnrecovered: why an
    // in-process recovery did not finish
    std::string reason;
    int signal = 0;  // kSignalled
    int rank = -1;   // kHung: the rank detected
  };
  // Each attempt: the next assignment, the group started and watched, the verdict. An exit
  // code, -1 to run again, or FailurePolicy::kRecoverInProcess to watch the same group on.
  int RunAttempts();
  int Verdict(const Watch& w);
  // `assigned_at`: when the assignment arrived (for the restart's timing line).
  absl::Status SpawnGroup(const Assignment& next, int attempt, SteadyTime assigned_at);
  Watch WatchGroup();
  // Returns the first forwarded (job-stopping) signal among `events`, else 0.
  int HandleEvents(const std::vector<ProcEvent>& events);
  void StopGroup(int first_signal);
  // Waits for the group to end until `deadline`, heartbeating the source meanwhile; returns
  // whether every worker ended.
  bool WaitForGroup(SteadyTime deadline);
  // The verdict after every local worker succeeded: an exit code, or -1 to run again.
  int AfterSuccess();
  absl::StatusOr<Assignment> NextAssignment(int* signal);
  // --profile-ranks that the job does not have: one line, at the first group (node 0).
  void WarnOfProfileRanksNotInTheJob() const;

  const AgentOptions options_;  // as launch.cc planned it: nothing changes it after
  std::shared_ptr<MembershipSource> source_;
  std::shared_ptr<JobChannel> channel_;
  Processes& processes_;
  Clock& clock_;
  RunDir run_dir_;            // the only way to the run directory's files
  AgentTelemetry telemetry_;  // after channel_ and clock_, which it uses
  Forensics forensics_;       // after run_dir_ and telemetry_
  DiagnosticsResponder diagnostics_;
  WorkerGroup group_;
  FailurePolicy failures_;      // the failure and hang paths, the repeat rule
  InProcessRecovery recovery_;  // after group_ and failures_ (its hang watch)
  // A restart's phases (bench/recovery reads them from the rank table's header): when the agent
  // saw the fault, and when the rest of the group was stopped.
  std::optional<SteadyTime> fault_seen_at_, stopped_at_;
};

}  // namespace dlrun::launcher
