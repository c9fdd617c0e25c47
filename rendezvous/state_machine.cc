// The rendezvous' rounds (state_machine.h). The running round's membership is here too: who is
// lost, and what the round does without them (a new round, the job's failure below min_nodes,
// or, when every survivor recovers in process, the same round at the smaller size:
// docs/RECOVERY.md, "A node lost"), and a node admitted into it at the larger size ("A node
// that joins"; admission.h holds it until the new group's port is posted).
#include "rendezvous/state_machine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlrun::rdzv {
namespace {

int64_t Seconds(Duration d) { return std::chrono::duration_cast<std::chrono::seconds>(d).count(); }

// Lost: silent past the liveness limit, or its watch ended and nothing was heard from it within
// the watch grace; never the node being admitted.
bool IsLost(const Roster::Member& m, TimePoint now, const Config& config,
            const Admission& admitting) {
  if (admitting.Holds(m.node.node_id)) return false;  // waits
  if (now - m.last_seen > config.liveness_limit()) return true;
  const std::optional<TimePoint> at = WatchLossAt(m, config.watch_grace);
  return at && now >= *at;
}

}  // namespace

StateMachine::StateMachine(Config config, TimePoint now)
    : config_(std::move(config)), round_opened_at_(now) {}

void StateMachine::Resume(const NodeInfo& node, Deliveries* out) {
  // Only a host that has not closed a round yet rebuilds state from resumes: for a host that is
  // running, a survivor's join is an ordinary re-join.
  if (!known_.empty() || state_.phase != Phase::kJoining) return;
  const ResumeInfo& r = node.resume;
  const bool first = expected_survivors_ == 0;
  state_.round = std::max<uint64_t>(state_.round, r.round + 1);
  expected_survivors_ = std::max(expected_survivors_, r.survivors);
  // The host's loss counts as a restart, as a lost node does; max() keeps it one however many
  // survivors report it.
  const int restarts = r.restart_count + 1;
  if (restarts > state_.restart_count) state_.restart_count = restarts;
  if (first) {
    state_.restart_reason = absl::StrCat("the rendezvous host (", r.lost_host, ") was lost");
  }
  if (state_.restart_count > config_.max_restarts) {
    Fail(absl::StrCat(state_.restart_reason,
                      "; no restarts left (max_restarts=", config_.max_restarts, ")"),
         out);
  }
}

absl::Status StateMachine::Join(const NodeInfo& node, uint64_t ticket, TimePoint now,
                                JoinCallback cb, Deliveries* out) {
  if (node.resume.round > 0) Resume(node, out);
  if (state_.phase == Phase::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job has failed: ", state_.failure_reason));
  }
  if (state_.phase == Phase::kSucceeded) {
    return absl::FailedPreconditionError("the job has already finished");
  }
  Pending p{node, ticket, std::move(cb)};
  if (state_.phase == Phase::kJoining) {
    if (static_cast<int>(joining_.size()) >= config_.max_nodes && !joining_.Has(node.node_id)) {
      waiting_.push_back(std::move(p));
      return absl::OkStatus();
    }
    joining_.Add(std::move(p), out);
    MaybeClose(now, out);
    return absl::OkStatus();
  }
  // Running.
  const bool is_member = members_.Find(node.node_id) != nullptr;
  if (std::optional<std::string> slow =
          is_member ? std::nullopt : SlowScaleUp(p.node, members_, config_.preflight_slow_ratio)) {
    out->push_back({std::move(p.cb), absl::FailedPreconditionError(*slow)});
    return absl::OkStatus();
  }
  if (!is_member && static_cast<int>(members_.size()) >= config_.max_nodes) {
    waiting_.push_back(std::move(p));  // full: held until a round opens for another reason
    return absl::OkStatus();
  }
  // Admitted: the same round, the node takes the state from a peer.
  if (!is_member && p.node.in_process && Admit(p, now)) return absl::OkStatus();
  waiting_.push_back(std::move(p));
  OpenRound(now,
            is_member ? absl::StrCat("node ", node.hostname, " (", node.node_id, ") re-joined")
                      : absl::StrCat("scale-up: node ", node.hostname, " is waiting to join"),
            /*counts_as_restart=*/false, out);
  return absl::OkStatus();
}

bool StateMachine::CancelJoin(const std::string& node_id, uint64_t ticket) {
  if (admitting_.Cancel(node_id, ticket)) return true;
  if (joining_.Cancel(node_id, ticket)) {
    if (static_cast<int>(joining_.size()) < config_.min_nodes) min_reached_at_.reset();
    return true;
  }
  for (auto w = waiting_.begin(); w != waiting_.end(); ++w) {
    if (w->node.node_id == node_id && w->ticket == ticket) {
      waiting_.erase(w);
      return true;
    }
  }
  return false;
}

void StateMachine::OpenRound(TimePoint now, const std::string& reason, bool counts_as_restart,
                             Deliveries* out, bool fallback) {
  // The node being admitted joins the new round.
  if (std::optional<Pending> p = admitting_.Release()) waiting_.push_back(std::move(*p));
  ++state_.round;
  state_.restart_reason = reason;
  state_.phase = Phase::kJoining;
  round_opened_at_ = now;
  min_reached_at_.reset();
  expected_.clear();
  // Nodes that already finished come back too: a restart reruns the whole job.
  for (const Member& m : members_) expected_.insert(m.node.node_id);
  // A fallback (a restart in place of an in-process recovery) is a restart the workers see
  // (TORCHELASTIC_RESTART_COUNT), not one of max_restarts.
  if (counts_as_restart && fallback) ++fallbacks_;
  if (counts_as_restart && ++state_.restart_count - fallbacks_ > config_.max_restarts) {
    Fail(absl::StrCat(reason, "; no restarts left (max_restarts=", config_.max_restarts, ")"),
         out);
    return;
  }
  std::vector<Pending> waiting = std::move(waiting_);
  waiting_.clear();
  for (Pending& p : waiting) {
    if (static_cast<int>(joining_.size()) < config_.max_nodes || joining_.Has(p.node.node_id)) {
      expected_.insert(p.node.node_id);
      joining_.Add(std::move(p), out);
    } else {
      waiting_.push_back(std::move(p));
    }
  }
  MaybeClose(now, out);
}

void StateMachine::MaybeClose(TimePoint now, Deliveries* out) {
  if (state_.phase != Phase::kJoining) return;
  const int n = static_cast<int>(joining_.size());
  if (n >= config_.max_nodes) return Close(now, out);
  if (n < config_.min_nodes) return;
  if (expected_survivors_ > 0 && known_.empty() && n >= expected_survivors_) {
    return Close(now, out);  // every survivor of the lost host's round is here
  }
  if (!expected_.empty() && std::all_of(expected_.begin(), expected_.end(),
                                        [&](const std::string& id) { return joining_.Has(id); })) {
    return Close(now, out);  // every survivor is back: no need to wait for the last call
  }
  if (!min_reached_at_) min_reached_at_ = now;
  if (now >= *min_reached_at_ + config_.last_call) Close(now, out);
}

void StateMachine::Close(TimePoint now, Deliveries* out) {
  const std::vector<std::string> slow = joining_.LeaveOutSlow(config_.preflight_slow_ratio, out);
  if (!slow.empty() && static_cast<int>(joining_.size()) < config_.min_nodes) {
    return Fail(absl::StrCat("the preflight found a slow node the round cannot do without "
                             "(--nnodes needs at least ",
                             config_.min_nodes, "): ", absl::StrJoin(slow, "; ")),
                out);
  }
  std::vector<Pending> joined = joining_.TakeInRankOrder(config_.first_node_id);
  members_.Clear();
  for (Pending& p : joined) {
    known_.insert(p.node.node_id);
    members_.Add({std::move(p.node), now, false, false, std::nullopt});
  }
  const int master_port = joined.empty() ? 0 : members_.front().node.master_port;
  std::vector<Assignment> assigned =
      members_.Assignments(state_.round, state_.restart_count, master_port);
  out->reserve(out->size() + joined.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    out->push_back({std::move(joined[i].cb), std::move(assigned[i])});
  }
  expected_.clear();
  min_reached_at_.reset();
  state_.phase = Phase::kRunning;
}

void StateMachine::Fail(const std::string& reason, Deliveries* out) {
  state_.phase = Phase::kFailed;
  state_.failure_reason = reason;
  std::vector<Pending> held = joining_.TakeAll();
  for (Pending& p : waiting_) held.push_back(std::move(p));
  waiting_.clear();
  if (std::optional<Pending> p = admitting_.Release()) held.push_back(std::move(*p));
  for (Pending& p : held) {
    out->push_back({std::move(p.cb),
                    absl::FailedPreconditionError(absl::StrCat("the job has failed: ", reason))});
  }
}

absl::StatusOr<HeartbeatReply> StateMachine::Heartbeat(const std::string& node_id, uint64_t round,
                                                       TimePoint now, bool in_process) {
  if (!known_.count(node_id)) {
    return absl::NotFoundError(absl::StrCat("node id '", node_id, "' has never been a member"));
  }
  HeartbeatReply r;
  r.current_round = state_.round;
  if (state_.phase == Phase::kFailed) {
    told_end_.insert(node_id);
    r.action = Action::kStop;
    r.reason = state_.failure_reason;
    return r;
  }
  if (state_.phase == Phase::kSucceeded) {
    told_end_.insert(node_id);
    r.action = Action::kFinished;
    r.reason = "every node finished successfully";
    return r;
  }
  Member* m = members_.Find(node_id);
  if (state_.phase == Phase::kRunning && round == state_.round && m != nullptr) {
    m->last_seen = now;
    m->in_process = in_process;
    r.action = Action::kContinue;
    return r;
  }
  if (round > state_.round) {
    return absl::InvalidArgumentError(
        absl::StrCat("round ", round, " is in the future (current round is ", state_.round, ")"));
  }
  // Heard from, even if it is still stopping its workers: a joining round keeps waiting for it.
  if (m != nullptr) m->last_seen = now;
  r.action = Action::kRestart;  // a newer round is open or running: stop workers and re-join
  r.reason = state_.restart_reason.empty() ? "a new round is open" : state_.restart_reason;
  return r;
}

absl::StatusOr<FailureReply> StateMachine::ReportFailure(const std::string& node_id,
                                                         uint64_t round,
                                                         const std::string& reason,
                                                         TimePoint now, Deliveries* out,
                                                         bool fatal, bool fallback) {
  const Member* m = members_.Find(node_id);
  if (m == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("node id '", node_id, "' is not a member of round ", state_.round));
  }
  FailureReply r;
  if (state_.phase == Phase::kRunning && round == state_.round) {
    const std::string what = absl::StrCat("worker failure on ", m->node.hostname, ": ", reason);
    if (fatal) {
      Fail(absl::StrCat(what, "; it repeats the last failure, so no restart"), out);
    } else {
      OpenRound(now, what, /*counts_as_restart=*/true, out, fallback);
    }
  }
  // A stale round number changes nothing: that failure has already opened a newer round.
  r.next_round = state_.round;
  r.restarts_exhausted = state_.phase == Phase::kFailed;
  return r;
}

absl::Status StateMachine::Leave(const std::string& node_id, uint64_t round, bool success,
                                 TimePoint now, Deliveries* out) {
  Member* m = members_.Find(node_id);
  if (m == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("node id '", node_id, "' is not a member of round ", state_.round));
  }
  if (round != state_.round || state_.phase != Phase::kRunning) return absl::OkStatus();  // stale
  if (!success) {
    auto r = ReportFailure(node_id, round, "the node left after a failure", now, out);
    return r.ok() ? absl::OkStatus() : r.status();
  }
  m->left = true;
  if (std::all_of(members_.begin(), members_.end(), [](const Member& m) { return m.left; })) {
    state_.phase = Phase::kSucceeded;
    for (Pending& p : waiting_) {
      out->push_back({std::move(p.cb), absl::FailedPreconditionError("the job has finished")});
    }
    waiting_.clear();
  }
  return absl::OkStatus();
}

void StateMachine::Tick(TimePoint now, Deliveries* out) {
  if (state_.phase == Phase::kJoining) {
    const int n = static_cast<int>(joining_.size());
    if (n < config_.min_nodes && now >= round_opened_at_ + config_.join_timeout) {
      std::string msg = absl::StrCat("rendezvous round ", state_.round, " timed out after ",
                                     Seconds(config_.join_timeout), " s: ", n, " of the minimum ",
                                     config_.min_nodes, " nodes joined");
      if (n > 0) absl::StrAppend(&msg, " (", joining_.Hosts(), ")");
      if (!config_.expected_hosts.empty()) {
        absl::StrAppend(&msg, "; expected ", absl::StrJoin(config_.expected_hosts, ", "));
      }
      Fail(msg, out);
      return;
    }
    // A member of the last round that has neither re-joined nor been heard from for the
    // liveness limit is lost (e.g. its node died and its workers' peers reported the failure
    // first): stop expecting it, so the survivors' round closes without the last call.
    const Duration limit = config_.liveness_limit();
    for (auto it = expected_.begin(); it != expected_.end();) {
      const Member* m = joining_.Has(*it) ? nullptr : members_.Find(*it);
      if (m != nullptr && now - m->last_seen > limit) {
        it = expected_.erase(it);
      } else {
        ++it;
      }
    }
    MaybeClose(now, out);
    return;
  }
  if (state_.phase != Phase::kRunning) return;
  if (std::optional<Admission::Expiry> e = admitting_.Expired(now, config_.admit_timeout)) {
    members_.Erase(e->node_id);
    return OpenRound(now, e->reason, /*counts_as_restart=*/false, out);
  }
  DropLost(now, out);
}

std::optional<TimePoint> StateMachine::NextDeadline() const {
  if (state_.phase == Phase::kJoining) {
    TimePoint next = min_reached_at_ ? *min_reached_at_ + config_.last_call
                                     : round_opened_at_ + config_.join_timeout;
    for (const std::string& id : expected_) {  // when an absent member counts as lost
      const Member* m = joining_.Has(id) ? nullptr : members_.Find(id);
      if (m != nullptr) next = std::min(next, m->last_seen + config_.liveness_limit() + Duration(1));
    }
    return next;
  }
  if (state_.phase != Phase::kRunning || members_.empty()) return std::nullopt;
  TimePoint next = admitting_.deadline().value_or(TimePoint::max());
  for (const Member& m : members_) {
    next = std::min(next, m.last_seen + config_.liveness_limit() + Duration(1));
    if (const std::optional<TimePoint> at = WatchLossAt(m, config_.watch_grace)) {
      next = std::min(next, *at);
    }
  }
  if (next == TimePoint::max()) return std::nullopt;
  return next;
}

void StateMachine::ExtendLiveness(TimePoint now) {
  for (Member& m : members_) m.last_seen = std::max(m.last_seen, now);
}

bool StateMachine::EndAcknowledged() const {
  if (state_.phase != Phase::kFailed && state_.phase != Phase::kSucceeded) return false;
  return std::all_of(members_.begin(), members_.end(),
                     [&](const Member& m) { return told_end_.count(m.node.node_id) > 0; });
}

StatusSnapshot StateMachine::Snapshot() const {
  StatusSnapshot s;
  s.round = state_.round;
  switch (state_.phase) {
    case Phase::kJoining: s.phase = "joining"; break;
    case Phase::kRunning: s.phase = "running"; break;
    case Phase::kFailed: s.phase = "failed"; break;
    case Phase::kSucceeded: s.phase = "succeeded"; break;
  }
  s.joined = static_cast<int>(state_.phase == Phase::kRunning ? members_.size() : joining_.size());
  s.waiting = static_cast<int>(waiting_.size());
  s.restart_count = state_.restart_count;
  for (const Member& m : members_) s.nodes.push_back(m.node.hostname);
  return s;
}

void StateMachine::DropLost(TimePoint now, Deliveries* out) {
  if (std::none_of(members_.begin(), members_.end(),
                   [&](const Member& m) { return IsLost(m, now, config_, admitting_); })) {
    return;
  }
  // Drop the dead from the membership so the new round does not wait for them.
  std::vector<std::string> dead;
  std::vector<Member> alive;
  for (Member& m : members_) {
    if (IsLost(m, now, config_, admitting_)) {
      dead.push_back(absl::StrCat(m.node.hostname, " (", m.node.node_id,
                                  now - m.last_seen > config_.liveness_limit()
                                      ? ", missed heartbeats)"
                                      : ", its connection closed)"));
    } else {
      alive.push_back(std::move(m));
    }
  }
  members_.Replace(std::move(alive));
  const int survivors = static_cast<int>(members_.size() + waiting_.size());
  const std::string what =
      absl::StrCat("lost ", dead.size(), " node(s): ", absl::StrJoin(dead, ", "));
  if (survivors < config_.min_nodes) {
    ++state_.round;
    Fail(absl::StrCat(what, "; ", survivors, " node(s) left, below the minimum of ",
                      config_.min_nodes),
         out);
    return;
  }
  if (waiting_.empty() && members_.AllRecoverInProcess()) {
    resize_ = Resize{state_.round, {}, 0, "", what, ""};
    members_.Place(&*resize_);
    state_.restart_reason = what;
    return;
  }
  OpenRound(now, what, /*counts_as_restart=*/true, out);
}

std::optional<Resize> StateMachine::TakeResize() {
  std::optional<Resize> s = std::move(resize_);
  resize_.reset();
  return s;
}

bool StateMachine::Admit(Pending& p, TimePoint now) {
  if (state_.phase != Phase::kRunning || admitting_.active() || resize_ || !waiting_.empty() ||
      static_cast<int>(members_.size()) >= config_.max_nodes || !members_.AllRecoverInProcess()) {
    return false;
  }
  const std::string what =
      absl::StrCat("node ", p.node.hostname, " (", p.node.node_id, ") joined the running round");
  members_.Add({p.node, now, false, false, std::nullopt});
  resize_ = Resize{state_.round, {}, 0, "", what, p.node.node_id};
  members_.Place(&*resize_);
  state_.restart_reason = what;
  admitting_.Begin(std::move(p), now + config_.admit_timeout);
  return true;
}

void StateMachine::Admitted(uint64_t round, int generation, int port, Deliveries* out) {
  if (round != state_.round || state_.phase != Phase::kRunning) return;
  std::optional<Pending> p = admitting_.Answer();
  if (!p) return;
  const std::optional<size_t> at = members_.IndexOf(p->node.node_id);
  if (!at) return;
  Assignment a = members_.Assignments(state_.round, state_.restart_count, port)[*at];
  a.recovery_generation = generation;
  known_.insert(p->node.node_id);
  out->push_back({std::move(p->cb), std::move(a)});
}

void StateMachine::WatchEnded(const std::string& node_id, TimePoint now) {
  if (state_.phase == Phase::kRunning) members_.WatchEnded(node_id, now);
}

void StateMachine::Heard(const std::string& node_id, TimePoint now) {
  members_.Heard(node_id, now);
}

}  // namespace dlrun::rdzv
