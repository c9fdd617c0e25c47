// A node's in-process recovery as a state machine (docs/RECOVERY.md; its diagram is in
// docs/ARCHITECTURE.md, "Recovery"). Pure: no I/O, no clock of its own, no processes. The
// agent hands it events (a worker's failure or end, the job's regroup notice, the result of
// what it was told to do, a rank's "state from peer" record, the time) and carries out the
// decisions it returns through its seams (Processes, RegroupLink, telemetry, the log).
//
//   kHealthy --failure, recoverable--> kRecover: the agent picks the port, then
//       Began() (one node)         --> kAwaitingState (generation G, replacements started)
//       Asked() (across nodes)     --> kAsked (the job's answer, its port, awaited)
//   kHealthy --notice of another node's loss or an admission--> kBegin --Began()--> kAwaitingState
//   kAsked   --notice with the port--> kBegin --Began()--> kAwaitingState
//   kAwaitingState --every rank's "P" record--> kHealthy (kDone)
//   any recovery state --a failure, the deadline, a rank that finished, a notice leaving this
//       node out, a port that cannot be posted, a replacement that cannot start-->
//       kFallingBack (the ordinary restart from the checkpoint) --GroupStarted()--> kHealthy
//       (or kAwaitingState: a node admitted into a running group).
// tests/launcher/agent/recovery_machine_test.cc walks every row of this on a fake clock.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/assignment.h"
#include "launcher/recovery/regroup_link.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/root_cause.h"

namespace dlrun::launcher {

class RecoveryMachine {
 public:
  enum class Phase {
    kHealthy,        // generation G running; no recovery under way
    kAsked,          // across nodes: this node's loss asked of the job, its port awaited
    kAwaitingState,  // generation G begun: waiting for every rank's "state from peer" record
    kFallingBack,    // the ordinary path (a restart from the checkpoint, or the job's end)
  };
  struct Config {
    bool asked_for = false;       // --recovery in-process and a port picker
    bool single_node_job = true;  // the job spans this node only
    bool can_regroup = false;     // a RegroupLink: the nodes agree through the rendezvous
    Millis timeout{60000};        // --recovery-timeout
    bool across_nodes() const { return can_regroup && !single_node_job; }
  };
  // A local worker as the machine sees it.
  struct Member {
    int local_rank = 0;
    pid_t pid = -1;
    bool alive = false;
    bool recoverable = false;  // declared in-process recovery
  };
  struct Decision {
    enum class Kind {
      kNone,         // nothing to do
      kFallBack,     // a failure takes the ordinary path; `why` is its line (empty: say nothing)
      kRecover,      // recover `lost`: pick the port if `needs_port`, then Asked() or Began()
      kPostPort,     // this node (of global rank 0) picks and posts generation G's port
      kBegin,        // begin generation G over `next`: start `lost` again, tell the survivors
      kUnrecovered,  // stop the group and restart from the checkpoint: `why`
      kDone,         // every rank holds the state of `step`, `seconds` after the fault
    };
    Kind kind = Kind::kNone;
    std::string why;
    int generation = 0;
    bool needs_port = false;        // kRecover
    std::vector<WorkerExit> lost;   // kRecover, kBegin: the local ranks to start again
    std::vector<std::string> said;  // kBegin: the loss, one line each
    Assignment next;                // kBegin: the group of generation G
    SteadyTime fault{};             // kBegin: when the recovery began; kDone: its end
    bool elsewhere = false;         // kBegin: another node's loss or admission, seen now
    bool admission = false;         // kBegin: a node joined (the group grows), no fault
    int64_t step = -1;              // kDone
    double seconds = 0;             // kDone
  };

  explicit RecoveryMachine(Config config) : config_(std::move(config)) {}

  // A group started: generation 0, or `admitted_at` > 0 for a node admitted into a running
  // group, whose every rank (`pids`) takes the state from a peer.
  void GroupStarted(int admitted_at, std::vector<pid_t> pids, SteadyTime now);
  // Workers failed (`exits`, failed or not, since the last recovery). `last_step(rank)`: the last
  // step that rank reported; `stopping`: the agent is stopping the group.
  Decision Failed(const std::vector<Member>& members, const std::vector<WorkerExit>& exits,
                  const Assignment& current, bool stopping,
                  const std::function<int64_t(int)>& last_step);
  // The agent could not do what kRecover asked (no free port): the ordinary path, with `why`.
  Decision Abandon(const std::string& why);
  // Across nodes, the job's answer to this node's ask for generation G + 1 (kRecover) with
  // `lost` and their lines `said`.
  Decision Asked(const absl::Status& answer, std::vector<WorkerExit> lost,
                 std::vector<std::string> said, SteadyTime now);
  // The job's latest regroup notice, for this node `node_id` whose group is `current`.
  Decision Noticed(const RegroupLink::Notice& notice, const Assignment& current,
                   const std::string& node_id, const std::vector<Member>& members, SteadyTime now);
  // The result of posting generation G's port (kPostPort).
  Decision Posted(const absl::Status& posted, int generation);
  // Generation G began (kRecover one node, or kBegin): replacements started for `lost`, the
  // survivors told; `pids`: every local rank, each of which is to send a "P" record. `started`
  // false: a replacement could not start.
  Decision Began(bool started, const Decision& begun, std::vector<pid_t> pids,
                 int64_t lost_last_step);
  // A rank's "state from peer" record.
  Decision StateFromPeer(pid_t pid, int64_t step, SteadyTime now);
  // The time now, and the exits so far: the deadline, or a rank that finished its work.
  Decision Tick(SteadyTime now, const std::vector<WorkerExit>& exits);

  Phase phase() const { return phase_; }
  bool across_nodes() const { return config_.across_nodes(); }
  int generation() const { return generation_; }
  bool recovering() const { return phase_ == Phase::kAsked || phase_ == Phase::kAwaitingState; }
  std::optional<SteadyTime> deadline() const {
    return recovering() ? std::optional<SteadyTime>(deadline_) : std::nullopt;
  }
  // The fault the recovery under way began with (its lines), also once a failure during it
  // made it fall back (the restart's cause); empty after a recovery that ended, and in a group
  // that never began one.
  const std::string& recovering_from() const { return recovering_from_; }
  // Whether a declaring program's lost rank is recovered in process here at all (asked for, and
  // one node or nodes that can regroup): a failure that ends in a restart replaces a recovery.
  bool applies() const {
    return config_.asked_for && (config_.single_node_job || config_.can_regroup);
  }

 private:
  Decision FallBack(Decision::Kind kind, std::string why);
  std::string WhyNot(const std::vector<Member>& members, const std::vector<WorkerExit>& exits,
                     bool stopping, const std::function<int64_t(int)>& last_step) const;
  // A node lost and the job going on without it: this node's new place in `next`; false when
  // the notice leaves it out.
  static bool TakePlace(const RegroupLink::Notice& n, const std::string& node_id, Assignment* next);
  std::string UnrecoveredReason() const;

  Config config_;
  Phase phase_ = Phase::kHealthy;
  int generation_ = 0;
  SteadyTime started_{}, deadline_{};
  std::vector<pid_t> awaiting_;  // the ranks that have not said they hold the state
  std::string recovering_from_;
  // The last recovery's lost rank and its step: the same twice takes the ordinary restart.
  std::optional<std::pair<int, int64_t>> last_recovered_;
  // Across nodes: this node's lost workers and their lines while the job's answer is awaited;
  // the generation whose port this node posted.
  std::vector<WorkerExit> pending_lost_;
  std::vector<std::string> pending_said_;
  int posted_for_ = 0;
};

const char* PhaseName(RecoveryMachine::Phase p);

}  // namespace dlrun::launcher
