// The local agent: starts this node's workers, supervises them in one event loop, restarts the
// group on failure as its membership source allows, forwards signals, and never leaves a
// worker behind. The loop reaches the operating system only through Processes and Clock, so
// tests drive it in-process with a fake process table and a fake clock
// (tests/launcher/agent/), and the POSIX side (posix_processes.h) is tested on its own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/assignment.h"
#include "common/defaults.h"
#include "launcher/agent/agent_options.h"
#include "launcher/agent/agent_telemetry.h"
#include "launcher/agent/clock.h"
#include "launcher/agent/diagnostics.h"
#include "launcher/agent/forensics.h"
#include "launcher/agent/membership.h"
#include "launcher/agent/processes.h"
#include "launcher/agent/recovery_machine.h"
#include "launcher/agent/root_cause.h"
#include "launcher/agent/run_dir.h"
#include "launcher/profile/profiler.h"
#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {

class Agent {
 public:
  // dlrun's exit code when a hang (hang_watch.h) ends the job.
  static constexpr int kHangExitCode = 124;
  Agent(AgentOptions options, JobLink link, Processes& processes, Clock& clock);
  // Runs until the job ends; returns the exit code for dlrun: 0; 1 when workers failed (as
  // torchrun; with exit_with_worker_code the root cause's own code, 128+N for a signal); 1 when
  // the rendezvous stopped the job; kHangExitCode after a hang; 128+N if dlrun itself got
  // forwarded signal N.
  int Run();

 private:
  int RunAttempts();
  struct Worker {
    int local_rank = 0;
    int rank = 0;  // global, in its attempt
    pid_t pid = -1;
    bool alive = false;
    bool recoverable = false;  // declared in-process recovery (a "C recovery" record)
  };
  // How one attempt's supervision ended.
  struct Watch {
    enum class Outcome { kSucceeded, kFailed, kHung, kSignalled, kRestart, kStop, kUnrecovered } outcome;
    // kRestart, kStop: the rendezvous' reason; kHung: why it hung; kUnrecovered: why an
    // in-process recovery did not finish
    std::string reason;
    int signal = 0;      // kSignalled
    int rank = -1;       // kHung: the rank detected
  };

  // `assigned_at`: when the assignment arrived (for the restart's timing line).
  absl::Status SpawnGroup(SteadyTime assigned_at);
  Watch WatchGroup();
  // Returns the first forwarded (job-stopping) signal among `events`, else 0.
  int HandleEvents(const std::vector<ProcEvent>& events);
  void StopGroup(int first_signal);
  // Waits for the group to end until `deadline`, heartbeating the source meanwhile; returns
  // whether every worker ended.
  bool WaitForGroup(SteadyTime deadline);
  // The verdict after every local worker succeeded: an exit code, or -1 to run again.
  int AfterSuccess();
  int AfterFailure();
  // Whether `now` repeats the last attempt's root failure (RepeatsTheLast); it becomes the last.
  bool RepeatsLastFailure(const FailureSignature& now);
  // A failure HardwareFault named: the second puts this node in options_.bad_nodes_files.
  void NoteHardwareFault(const std::string& what);
  // In-process recovery (agent_recovery.cc), the decisions of recovery_ carried out: whether
  // the failed workers in exits_ are being replaced while the others keep running (false: the
  // ordinary failure path).
  bool RecoverInProcess();
  std::vector<RecoveryMachine::Member> Members() const;
  std::vector<std::string> NoteLost(const std::vector<WorkerExit>& lost);
  // Begins generation d.generation over d.next: d.lost started again, the survivors told.
  bool Begin(const RecoveryMachine::Decision& d);
  void DropFailedExits();
  // The job's regroup (another node's loss too, or the answer to this node's ask), begun here
  // once its port is known; this node of global rank 0 posts the port. A watch outcome when it
  // cannot take part.
  std::optional<Watch> FollowRegroup();
  // Tells the job (regroup_) whether every worker here declared in-process recovery.
  void TellInProcess();
  bool StartReplacements(const std::vector<WorkerExit>& lost, const Assignment& next,
                         int generation, std::vector<std::string>* replaced);
  // A "state from peer" record of `pid`: the recovery in progress ends when every rank sent one.
  void StateFromPeer(pid_t pid, int64_t step);
  // A C++ program that declared in-process recovery can run as a warm spare (it meets
  // init() first): one for `local_rank` from now on (options_.spares_on_declaration).
  void SpareOnDeclaration(int local_rank);
  // --profile-ranks that the job does not have: one line, at the first group (node 0).
  void WarnOfProfileRanksNotInTheJob() const;
  // The workers file for `dlrun stacks` (the group's ranks and pids).
  void WriteWorkersFile(const std::vector<DumpTarget>& group);
  // Whether the first failure's stacks tell something (--capture-before-kill auto): not a plain
  // exception whose traceback is in its error file.
  bool FirstFailureTells() const;
  // What the root failure says (message), what happened (cause), and a crash's faulting frame.
  struct FailureDescription {
    std::string message;  // for the log and the report
    std::string cause;    // "rank 3 got SIGSEGV at f": the restart cause, "WHAT; the others were..."
    std::shared_future<std::string> faulting_frame;  // invalid: no crash trace
  };
  FailureDescription DescribeFailure(const RootCause& root, bool has_error_file);
  int AliveCount() const;
  // Stops the group with SIGTERM after a capture before kill (forensics_) for `why`.
  void StopWithCapture(const std::string& why);
  std::vector<DumpTarget> LiveTargets() const;
  std::vector<int> Ranks() const;  // the group's global ranks on this node
  // Hang detection (agent_hang.cc): a hung worker or group now (a kHung watch whose reason
  // names it), else nullopt with `next` the next time to look; once per idle spell, a line
  // saying where every rank is.
  std::optional<Watch> CheckHangs(SteadyTime* next);
  // The hang path: the stacks of every rank, the culprit named from them (else `rank`, the one
  // detected), the group stopped; the exit code, or -1 to run again.
  int AfterHang(const std::string& reason, int rank);
  // The live ranks' stacks now, and what they say of a hang.
  HangVerdict WhereRanksAre();
  std::vector<int> StoppedRanks() const;
  absl::StatusOr<Assignment> NextAssignment(int* signal);
  bool IsPassthrough(int sig) const;
  // Passes `sig` (SIGUSR1, SIGUSR2: the job goes on) to every live worker.
  void PassOn(int sig);
  // A worker killed by such a signal had no handler for it: say so, and (once) what to do.
  void NoteDeathByPassedOnSignal(const WorkerExit& x);

  AgentOptions options_;
  std::shared_ptr<MembershipSource> source_;
  std::shared_ptr<JobChannel> channel_;
  std::shared_ptr<RegroupLink> regroup_;  // null: a single-node job, or one that cannot regroup
  Processes& processes_;
  Clock& clock_;
  RecoveryMachine recovery_;  // in-process recovery's state: the agent holds none of its own
  Assignment current_;
  int attempt_ = 0;
  // A restart's phases (bench/recovery reads them from the rank table's header): when the agent
  // saw the fault, and when the rest of the group was stopped.
  std::optional<SteadyTime> fault_seen_at_, stopped_at_;
  std::vector<Worker> workers_;
  bool stopping_ = false;
  bool woken_ = false;
  bool passthrough_hint_given_ = false;  // NoteDeathByPassedOnSignal's advice, once per run
  std::vector<WorkerExit> exits_;
  int64_t oom_kills_at_spawn_ = -1;  // Processes::OomKills() when the group started
  std::optional<FailureSignature> last_failure_;  // the last attempt's root failure
  int hardware_faults_ = 0;  // this node's workers' failures that point at the node
  HangWatch hang_;
  SteadyTime next_cpu_{};  // when hang_ next reads the workers' CPU use
  RunDir run_dir_;  // the only way to the run directory's files
  AgentTelemetry telemetry_;  // after channel_ and clock_, which it uses
  Forensics forensics_;       // after run_dir_ and telemetry_
  DiagnosticsResponder diagnostics_;
};

}  // namespace dlrun::launcher
