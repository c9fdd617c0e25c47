#include "launcher/recovery/recovery_machine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlrun::launcher {

using Kind = RecoveryMachine::Decision::Kind;

const char* PhaseName(RecoveryMachine::Phase p) {
  switch (p) {
    case RecoveryMachine::Phase::kHealthy:
      return "healthy";
    case RecoveryMachine::Phase::kAsked:
      return "asked";
    case RecoveryMachine::Phase::kAwaitingState:
      return "awaiting the state";
    case RecoveryMachine::Phase::kFallingBack:
      return "falling back";
  }
  return "?";
}

RecoveryMachine::Decision RecoveryMachine::FallBack(Decision::Kind kind, std::string why) {
  phase_ = Phase::kFallingBack;
  Decision d;
  d.kind = kind;
  d.why = std::move(why);
  return d;
}

void RecoveryMachine::GroupStarted(int admitted_at, std::vector<pid_t> pids, SteadyTime now) {
  generation_ = admitted_at;
  phase_ = admitted_at > 0 ? Phase::kAwaitingState : Phase::kHealthy;
  awaiting_ = admitted_at > 0 ? std::move(pids) : std::vector<pid_t>{};
  started_ = now;
  deadline_ = now + config_.timeout;
  recovering_from_.clear();
  pending_lost_.clear();
  pending_said_.clear();
  posted_for_ = 0;  // a new round numbers its regroups from 1 again
}

std::string RecoveryMachine::WhyNot(const std::vector<Member>& members,
                                    const std::vector<WorkerExit>& exits, bool stopping,
                                    const std::function<int64_t(int)>& last_step) const {
  std::string why;
  if (recovering()) {
    why = "another rank failed during the in-process recovery";
  } else if (!config_.single_node_job && !config_.can_regroup) {
    why = "this job's nodes cannot regroup (a static multi-node rendezvous)";
  } else if (stopping) {
    why = "the group is being stopped";
  }
  for (const Member& m : members) {
    if (why.empty() && !m.recoverable) {
      why = absl::StrCat("local rank ", m.local_rank, " did not declare in-process recovery");
    }
  }
  size_t failed = 0;
  for (const WorkerExit& e : exits) {
    if (why.empty() && !e.failed()) {  // a recovery needs every survivor in its loop
      why = absl::StrCat("rank ", e.global_rank, " already finished its work");
    }
    if (!e.failed()) continue;
    ++failed;
    // Any rank: a bug that the step done again meets fails on one rank, then on its
    // replacement's peer, alternately; recovering it again would never end.
    // A step unknown (-1: a program without step records) is not the same step.
    if (why.empty() && last_recovered_ && last_recovered_->second >= 0 &&
        last_recovered_->second == last_step(e.global_rank)) {
      why = absl::StrCat("rank ", e.global_rank, " failed after step ", last_recovered_->second,
                         " again (rank ", last_recovered_->first,
                         " failed there before and was recovered in process)");
    }
  }
  // Across nodes the survivors may all be elsewhere (a node of one rank): the job is asked.
  if (why.empty() && failed == members.size() && !config_.across_nodes()) {
    why = "no rank survived";
  }
  return why;
}

RecoveryMachine::Decision RecoveryMachine::Failed(const std::vector<Member>& members,
                                                  const std::vector<WorkerExit>& exits,
                                                  const Assignment& current, bool stopping,
                                                  const std::function<int64_t(int)>& last_step) {
  const bool declared =
      std::any_of(members.begin(), members.end(), [](const Member& m) { return m.recoverable; });
  // Not asked for, or a program that did not declare it: torchrun's semantics, silently.
  if (!config_.asked_for || !declared) return FallBack(Kind::kFallBack, "");
  if (std::string why = WhyNot(members, exits, stopping, last_step); !why.empty()) {
    return FallBack(Kind::kFallBack, std::move(why));
  }
  Decision d;
  d.kind = Kind::kRecover;
  d.generation = generation_ + 1;
  // The new group's port: this node's pick alone, or across nodes the pick of global rank 0's.
  d.needs_port = !config_.across_nodes() || current.rank_offset == 0;
  for (const WorkerExit& e : exits) {
    if (e.failed()) d.lost.push_back(e);
  }
  return d;
}

RecoveryMachine::Decision RecoveryMachine::Abandon(const std::string& why) {
  return FallBack(Kind::kFallBack, why);
}

RecoveryMachine::Decision RecoveryMachine::Asked(const absl::Status& answer,
                                                 std::vector<WorkerExit> lost,
                                                 std::vector<std::string> said, SteadyTime now) {
  if (!answer.ok()) {
    return FallBack(Kind::kFallBack, absl::StrCat("the job did not regroup: ", answer.message()));
  }
  phase_ = Phase::kAsked;
  pending_lost_ = std::move(lost);
  pending_said_ = std::move(said);
  started_ = now;
  deadline_ = now + config_.timeout;
  return {};
}

bool RecoveryMachine::TakePlace(const RegroupLink::Notice& n, const std::string& node_id,
                                Assignment* next) {
  for (const RegroupLink::Notice::Place& p : n.places) {
    if (p.node_id != node_id) continue;
    next->node_rank = p.node_rank;
    next->rank_offset = p.rank_offset;
    next->num_nodes = static_cast<int>(n.places.size());
    next->world_size = n.world_size;
    next->master_addr = n.master_addr;
    return true;
  }
  return false;
}

RecoveryMachine::Decision RecoveryMachine::Noticed(const RegroupLink::Notice& n,
                                                   const Assignment& current,
                                                   const std::string& node_id,
                                                   const std::vector<Member>& members,
                                                   SteadyTime now) {
  if (!config_.across_nodes() || phase_ == Phase::kFallingBack) return {};
  if (n.generation <= generation_) return {};
  Decision d;
  d.generation = n.generation;
  d.next = current;
  if (!n.places.empty() && !TakePlace(n, node_id, &d.next)) {
    return FallBack(
        Kind::kUnrecovered,
        absl::StrCat("generation ", n.generation, " goes on without this node (", n.reason, ")"));
  }
  if (n.master_port == 0 && d.next.rank_offset == 0 && posted_for_ != n.generation) {
    posted_for_ = n.generation;  // global rank 0's node picks the new group's port
    d.kind = Kind::kPostPort;
    return d;
  }
  if (n.master_port == 0) return {};  // posted soon by global rank 0's node
  d.elsewhere = phase_ != Phase::kAsked;
  d.fault = d.elsewhere ? now : started_;
  d.said = std::move(pending_said_);
  if (d.elsewhere) {  // another node's loss, or a node admitted (the group grows)
    d.admission = !n.places.empty() && n.world_size > current.world_size;
    d.said = {n.places.empty() ? absl::StrCat(n.reason.empty() ? "a rank was lost" : n.reason,
                                              " (on node ", n.asked_by, ")")
                               : absl::StrCat(n.reason, "; the job goes on with ", n.world_size,
                                              " rank(s) on ", n.places.size(), " node(s)")};
    for (const Member& m : members) {
      if (!m.recoverable || !m.alive) {
        return FallBack(
            Kind::kUnrecovered,
            absl::StrCat(d.said.front(), ": local rank ", m.local_rank,
                         m.alive ? " did not declare in-process recovery" : " is gone"));
      }
    }
  }
  d.kind = Kind::kBegin;
  d.next.master_port = n.master_port;
  d.lost = std::move(pending_lost_);
  pending_lost_.clear();
  pending_said_.clear();
  return d;
}

RecoveryMachine::Decision RecoveryMachine::Posted(const absl::Status& posted, int generation) {
  if (posted.ok()) return {};
  return FallBack(Kind::kUnrecovered, absl::StrCat("cannot post the port of generation ",
                                                   generation, ": ", posted.message()));
}

RecoveryMachine::Decision RecoveryMachine::Began(bool started, const Decision& begun,
                                                 std::vector<pid_t> pids, int64_t lost_last_step) {
  if (!started) {
    // One node: the replacement's line is said; the failure takes the ordinary path. From a
    // notice: the group cannot take part in the job's generation.
    return begun.kind == Kind::kBegin
               ? FallBack(Kind::kUnrecovered,
                          absl::StrCat("generation ", begun.generation, " could not start here"))
               : FallBack(Kind::kFallBack, "");
  }
  phase_ = Phase::kAwaitingState;
  generation_ = begun.generation;
  started_ = begun.fault;
  deadline_ = begun.fault + config_.timeout;
  awaiting_ = std::move(pids);
  recovering_from_ = absl::StrJoin(begun.said, "; ");
  if (!begun.lost.empty()) last_recovered_ = {begun.lost.front().global_rank, lost_last_step};
  return {};
}

RecoveryMachine::Decision RecoveryMachine::StateFromPeer(pid_t pid, int64_t step, SteadyTime now) {
  auto it = std::find(awaiting_.begin(), awaiting_.end(), pid);
  if (it == awaiting_.end()) return {};
  awaiting_.erase(it);
  if (!awaiting_.empty() || phase_ != Phase::kAwaitingState) return {};
  phase_ = Phase::kHealthy;
  recovering_from_.clear();
  Decision d;
  d.kind = Kind::kDone;
  d.generation = generation_;
  d.step = step;
  d.fault = now;
  d.seconds = std::chrono::duration<double>(now - started_).count();
  return d;
}

std::string RecoveryMachine::UnrecoveredReason() const {
  if (phase_ == Phase::kAsked) {
    return absl::StrCat("in-process recovery: generation ", generation_ + 1,
                        " asked of the job did not begin within ", config_.timeout.count(),
                        " ms (its master port never came)");
  }
  return absl::StrCat("in-process recovery (generation ", generation_, ") did not end within ",
                      config_.timeout.count(), " ms: ", awaiting_.size(),
                      " rank(s) never said they hold the state");
}

RecoveryMachine::Decision RecoveryMachine::Tick(SteadyTime now,
                                                const std::vector<WorkerExit>& exits) {
  if (!recovering()) return {};
  if (now >= deadline_) return FallBack(Kind::kUnrecovered, UnrecoveredReason());
  for (const WorkerExit& e : exits) {  // it would never say it holds the state
    if (!e.failed()) {
      return FallBack(Kind::kUnrecovered,
                      absl::StrCat("rank ", e.global_rank,
                                   " finished its work during the in-process recovery"));
    }
  }
  return {};
}

}  // namespace dlrun::launcher
