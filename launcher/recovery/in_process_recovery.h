// In-process recovery carried out (docs/RECOVERY.md, "A fault costs one step"): the decisions
// of the RecoveryMachine (recovery_machine.h, which holds the state) turned into processes
// started, words told, regroups asked and lines logged. The agent (agent.h) hands it the
// group's failures, the workers' declarations and "state from peer" records, and asks it each
// pass of its loop whether the job's regroup or the deadline ends the group.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/recovery/recovery_machine.h"
#include "launcher/recovery/regroup_link.h"
#include "launcher/workers/agent_options.h"
#include "launcher/workers/agent_telemetry.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/hang_watch.h"
#include "launcher/workers/processes.h"
#include "launcher/workers/run_dir.h"
#include "launcher/workers/worker_group.h"

namespace dlrun::launcher {

class InProcessRecovery {
 public:
  // The seams it acts through; `regroup` null: a single-node job, or one that cannot regroup.
  struct Seams {
    const AgentOptions& options;
    Processes& processes;
    Clock& clock;
    AgentTelemetry& telemetry;
    RunDir& run_dir;
    HangWatch& hang;
    WorkerGroup& group;
    JobChannel& channel;
  };
  InProcessRecovery(Seams seams, std::shared_ptr<RegroupLink> regroup);

  // A group started (WorkerGroup::Start): generation 0, or the one it was admitted at.
  void GroupStarted(SteadyTime now);
  // The group's failed workers (its exits) are being replaced while the others keep running;
  // false: the ordinary failure path.
  bool Recover();
  // The job's regroup (another node's loss, or the answer to this node's ask), begun here once
  // its port is known, and the deadline: why the group cannot go on in process, else nullopt.
  std::optional<std::string> Follow();
  std::optional<std::string> Tick();
  // A worker's "C recovery" (kDeclared) or "state from peer" (kFromPeer) record.
  void Record(pid_t pid, RecordKind kind, int64_t step);
  std::optional<SteadyTime> deadline() const { return machine_.deadline(); }
  // The fault the recovery under way began with, else empty.
  std::string recovering_from() const { return machine_.recovering_from(); }
  bool applies() const { return machine_.applies(); }
  // A recovery under way (asked of the job, or waiting for every rank's state).
  bool under_way() const { return machine_.recovering(); }

 private:
  // Begins generation d.generation over d.next: d.lost started again, the survivors told. The
  // machine's answer: kNone, or the fallback when a replacement could not start.
  RecoveryMachine::Decision Begin(const RecoveryMachine::Decision& d);
  // One line per lost rank (its error file's first line, else its signal or code), noted in
  // the report's failures.
  std::vector<std::string> NoteLost(const std::vector<WorkerExit>& lost);
  // Tells the job whether every worker here declared in-process recovery.
  void TellInProcess();
  // A C++ program that declared in-process recovery can run as a warm spare (it meets init()
  // first): one for `local_rank` from now on (options.spares_on_declaration).
  void SpareOnDeclaration(int local_rank);

  Seams s_;
  std::shared_ptr<RegroupLink> regroup_;
  RecoveryMachine machine_;
};

}  // namespace dlrun::launcher
