// The rendezvous as a pure state machine: rounds, membership, ranks and liveness.
// No gRPC, no protobuf, no clock of its own: every call takes `now`, so tests drive it with a
// fake clock. Not thread-safe; the handler serialises calls.
//
// A Join is a pending reply: the caller passes a callback, and the machine hands back
// `Delivery`s (callback + result) for the caller to run after it releases its lock. Nothing
// here blocks.
#pragma once

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/admission.h"
#include "rendezvous/joins.h"
#include "rendezvous/roster.h"
#include "rendezvous/types.h"

namespace dlrun::rdzv {

class StateMachine {
 public:
  enum class Phase { kJoining, kRunning, kFailed, kSucceeded };

  StateMachine(Config config, TimePoint now);

  // A node asks to join. Its callback runs when the round it lands in closes, or with an error.
  // `ticket` identifies this call for CancelJoin. Joins during a running round are held as
  // waiting and trigger a new round (scale-up) if there is room.
  absl::Status Join(const NodeInfo& node, uint64_t ticket, TimePoint now, JoinCallback cb,
                    Deliveries* out);
  // The caller of a pending join went away (RPC cancelled): forget it. Returns whether it was
  // still pending (then the caller finishes the call itself).
  bool CancelJoin(const std::string& node_id, uint64_t ticket);

  // `in_process`: every worker of the node declared in-process recovery (docs/RECOVERY.md).
  absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& node_id, uint64_t round,
                                           TimePoint now, bool in_process = false);
  // A member's held regroup watch ended without an answer (its caller went away): unless it is
  // heard from again (a heartbeat, a new watch) within config.watch_grace, it is lost.
  void WatchEnded(const std::string& node_id, TimePoint now);
  // A member of the running round was heard from (e.g. it opened a regroup watch).
  void Heard(const std::string& node_id, TimePoint now);
  // A node lost while every survivor recovers in process and enough are left, or a node
  // admitted: the round goes on (no new round); the regroup that tells the members, taken once.
  std::optional<Resize> TakeResize();
  // The new group's port of `generation` was posted after a node's admission (rendezvous/
  // regroup.h): its join is answered with its place, that port and the generation. Ignored
  // for another round or when no node is being admitted.
  void Admitted(uint64_t round, int generation, int port, Deliveries* out);
  // `fatal`: the job fails now instead of opening a new round (a failure that repeats).
  // `fallback`: the new round replaces an in-process recovery; it is not counted as a restart.
  absl::StatusOr<FailureReply> ReportFailure(const std::string& node_id, uint64_t round,
                                             const std::string& reason, TimePoint now,
                                             Deliveries* out, bool fatal = false,
                                             bool fallback = false);
  absl::Status Leave(const std::string& node_id, uint64_t round, bool success, TimePoint now,
                     Deliveries* out);

  // Advances timers: closes rounds at last call, fails on join timeout, declares silent nodes
  // dead. Call it at NextDeadline() (or any time; it is idempotent).
  void Tick(TimePoint now, Deliveries* out);
  std::optional<TimePoint> NextDeadline() const;
  // Counts every member as heard from now: after the host itself was not running (a frozen
  // process), silence says nothing about the members.
  void ExtendLiveness(TimePoint now);

  // The round's standing: its phase and number, the restarts so far, why it failed or opened.
  struct Standing {
    Phase phase = Phase::kJoining;
    uint64_t round = 1;
    int restart_count = 0;
    std::string failure_reason;
    std::string restart_reason;  // why the current round opened (for heartbeat replies)
  };
  const Standing& state() const { return state_; }
  // The last closed round's members (roster.h): their world size, the live ones, successors.
  const Roster& members() const { return members_; }
  // The job has ended and every member of the last round has been told so (by a heartbeat
  // reply), so a hosting agent may stop serving.
  bool EndAcknowledged() const;
  StatusSnapshot Snapshot() const;

 private:
  using Pending = PendingJoin;
  using Member = Roster::Member;
  // Drops the lost members; the survivors go on in the same round when they all recover in
  // process, else a new round opens (or the job fails below min_nodes).
  void DropLost(TimePoint now, Deliveries* out);
  // Admits `p` when the running round can take it in (every member recovers in process, room,
  // nothing else under way); false, `p` untouched, otherwise.
  bool Admit(Pending& p, TimePoint now);
  // A survivor's first join at a new host: take over the lost host's round and restart count.
  void Resume(const NodeInfo& node, Deliveries* out);
  // `fallback`: a restart in place of an in-process recovery, not counted against max_restarts.
  void OpenRound(TimePoint now, const std::string& reason, bool counts_as_restart,
                 Deliveries* out, bool fallback = false);
  void MaybeClose(TimePoint now, Deliveries* out);
  void Close(TimePoint now, Deliveries* out);
  void Fail(const std::string& reason, Deliveries* out);

  const Config config_;
  Standing state_;

  // The open round.
  OpenJoins joining_;
  std::unordered_set<std::string> expected_;  // nodes a re-rendezvous waits for
  TimePoint round_opened_at_;
  std::optional<TimePoint> min_reached_at_;

  // Joins held while a full round runs.
  std::vector<Pending> waiting_;

  // The last closed round, by node rank.
  Roster members_;
  std::unordered_set<std::string> known_;  // every node id ever assigned
  std::unordered_set<std::string> told_end_;  // nodes that got a STOP or FINISHED reply
  // After a failover: how many survivors the first round waits for before closing at once.
  int expected_survivors_ = 0;
  // Restarts of the count that were fallbacks (this host's; a failover host counts them all).
  int fallbacks_ = 0;
  std::optional<Resize> resize_;  // not yet taken
  Admission admitting_;
};

// preflight_round.cc: a node that would join the running round of `members`, far slower than
// they are: the line that refuses it at once (so the members do not restart for it); nullopt:
// it may join.
std::optional<std::string> SlowScaleUp(const NodeInfo& joining, const Roster& members,
                                       double slow_ratio);

}  // namespace dlrun::rdzv
