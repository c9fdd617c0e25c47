// The agent's failure and hang paths (agent.h): what a failure was (its root cause and class,
// with forensics.h's capture, faulting frame and Flight Recorder verdict), whether a worker or
// the group hangs (hang_watch.h, named from every rank's stack), and the verdict: restart, or
// end the job with an exit code. One repeat rule for both: a failure that repeats the last one
// the same way ends the job instead of spending every restart on it.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/failure_verdict.h"
#include "launcher/agent/membership.h"
#include "launcher/workers/agent_options.h"
#include "launcher/workers/agent_telemetry.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/forensics.h"
#include "launcher/workers/hang_watch.h"
#include "launcher/workers/processes.h"
#include "launcher/workers/root_cause.h"
#include "launcher/workers/run_dir.h"
#include "launcher/workers/worker_group.h"

namespace dlrun::launcher {

class FailurePolicy {
 public:
  // dlrun's exit code when a hang ends the job.
  static constexpr int kHangExitCode = 124;
  // AfterHang: the hung rank was killed alone; its exit is recovered in process (watch on).
  static constexpr int kRecoverInProcess = -2;
  struct Seams {
    const AgentOptions& options;
    Processes& processes;
    Clock& clock;
    RunDir& run_dir;
    AgentTelemetry& telemetry;
    Forensics& forensics;
    MembershipSource& source;
    WorkerGroup& group;
    std::function<void(int)> stop_group;  // the agent's stop: this signal, the grace, SIGKILL
  };
  explicit FailurePolicy(Seams seams) : s_(std::move(seams)), hang_(s_.options.hang) {}

  // After a worker failed (the group's exits): the group stopped, the failure described and
  // reported; -1 to run again, else dlrun's exit code. `recovering_from`: the fault of an
  // in-process recovery under way, which the restart names as the cause.
  // `in_process`: a declaring program's failure here is recovered in process where it can be
  // (RecoveryMachine::applies()), so a restart instead is a fallback (FallsBack).
  int AfterFailure(const std::string& recovering_from, bool in_process);
  struct Hung {
    std::string reason;
    int rank = -1;  // the rank detected; -1: the whole group idle
  };
  // A hung worker or group now, else nullopt with `next` the next time to look; once per idle
  // spell, a line saying where every rank is.
  std::optional<Hung> CheckHangs(SteadyTime* next);
  // The hang path: the culprit named from every rank's stack, the group stopped; -1 to run
  // again, else kHangExitCode.
  // `in_process`: a lost rank is recovered in process here now (RecoveryMachine::applies(), no
  // recovery under way): one hung rank of a declaring group is killed alone, and
  // kRecoverInProcess returned.
  int AfterHang(const Hung& hung, bool in_process);
  // Stops the group with SIGTERM after a capture before kill for `why`.
  void StopWithCapture(const std::string& why);
  HangWatch& hang() { return hang_; }

 private:
  // What the root failure says (message), what happened (cause), and a crash's faulting frame.
  struct Description {
    std::string message;                             // for the log and the report
    std::string cause;                               // "rank 3 got SIGSEGV at f": the restart cause
    std::shared_future<std::string> faulting_frame;  // invalid: no crash trace
  };
  Description Describe(const RootCause& root, bool has_error_file,
                       const std::string& recovering_from);
  // Each failed worker's error file by local rank, read once for the root cause and the report.
  std::map<int, ErrorRecord> FailedRecords() const;
  // Whether the first failure's stacks tell something (--capture-before-kill auto): not a
  // plain exception whose traceback is in its error file.
  bool FirstFailureTells() const;
  // Whether the job goes on after a failure (verdict_'s route carried out: the membership
  // source told, the restart said in one line): not when it repeats the last one, or no
  // restart is left.
  bool Restarts(const FailureSignature& signature, const std::string& cause,
                const WorkerExit& first, const char* class_name, bool in_process);
  // The pid of the one culprit to kill alone (a live local rank of a group that declared
  // in-process recovery), else -1.
  pid_t HungAlone(const std::vector<int>& culprits) const;
  // The hang in the report's failures, with the stacks captured before the stop.
  void NoteHang(int culprit, const std::string& message, std::optional<Forensics::Capture> capture,
                const std::vector<int>& culprits);
  // A failure HardwareFault named: the second puts this node in options.bad_nodes_files.
  void NoteHardwareFault(const std::string& what);
  // The live ranks' stacks now, and what they say of a hang.
  HangVerdict WhereRanksAre();

  Seams s_;
  HangWatch hang_;
  SteadyTime next_cpu_{};                         // when hang_ next reads the workers' CPU use
  FailureVerdict verdict_;  // the repeat rule and the fallback's once-per-step: pure
  int hardware_faults_ = 0;  // this node's workers' failures that point at the node
};

}  // namespace dlrun::launcher
