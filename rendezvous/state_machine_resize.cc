// The running round's membership (state_machine.h). Who is lost, and what the round does
// without them: a new round, the job's failure below min_nodes, or, when every survivor
// recovers in process, the same round at the smaller size (docs/RECOVERY.md, "A node lost").
// A node that joins while every member recovers in process is admitted into the same round at
// the larger size, its join answered once the new group's port is posted ("A node that joins").
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/state_machine.h"

namespace dlrun::rdzv {

bool StateMachine::IsLost(const Member& m, TimePoint now) const {
  if (admitting_ && admitting_->pending.node.node_id == m.node.node_id) return false;  // waits
  if (now - m.last_seen > config_.liveness_limit()) return true;
  const std::optional<TimePoint> at = WatchLossAt(m, config_.watch_grace);
  return at && now >= *at;
}

void StateMachine::DropLost(TimePoint now, Deliveries* out) {
  if (std::none_of(members_.begin(), members_.end(),
                   [&](const Member& m) { return IsLost(m, now); })) {
    return;
  }
  // Drop the dead from the membership so the new round does not wait for them.
  std::vector<std::string> dead;
  std::vector<Member> alive;
  for (Member& m : members_) {
    if (IsLost(m, now)) {
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
  if (state_.phase != Phase::kRunning || admitting_ || resize_ || !waiting_.empty() ||
      static_cast<int>(members_.size()) >= config_.max_nodes || !members_.AllRecoverInProcess()) {
    return false;
  }
  const std::string what =
      absl::StrCat("node ", p.node.hostname, " (", p.node.node_id, ") joined the running round");
  members_.Add({p.node, now, false, false, std::nullopt});
  resize_ = Resize{state_.round, {}, 0, "", what, p.node.node_id};
  members_.Place(&*resize_);
  state_.restart_reason = what;
  admitting_ = Admission{std::move(p), now + config_.admit_timeout, false};
  return true;
}

void StateMachine::Admitted(uint64_t round, int generation, int port, Deliveries* out) {
  if (!admitting_ || admitting_->cancelled || round != state_.round ||
      state_.phase != Phase::kRunning) {
    return;
  }
  Pending p = std::move(admitting_->pending);
  admitting_.reset();
  const std::optional<size_t> at = members_.IndexOf(p.node.node_id);
  if (!at) return;
  Assignment a;
  a.round = state_.round;
  a.node_rank = static_cast<int>(*at);
  a.num_nodes = static_cast<int>(members_.size());
  for (size_t i = 0; i < *at; ++i) a.rank_offset += members_[i].node.nproc;
  a.world_size = members_.WorldSize();
  a.local_world_size = p.node.nproc;
  a.master_addr = members_.front().node.address;
  a.master_port = port;
  a.restart_count = state_.restart_count;
  a.recovery_generation = generation;
  known_.insert(p.node.node_id);
  out->push_back({std::move(p.cb), std::move(a)});
}

bool StateMachine::CancelAdmission(const std::string& node_id, uint64_t ticket) {
  if (!admitting_ || admitting_->cancelled || admitting_->pending.ticket != ticket ||
      admitting_->pending.node.node_id != node_id) {
    return false;
  }
  admitting_->cancelled = true;  // the survivors wait for it in vain: a new round (Tick)
  admitting_->pending.cb = nullptr;
  admitting_->deadline = TimePoint::min();
  return true;
}

void StateMachine::ReleaseAdmission() {
  if (!admitting_) return;
  if (!admitting_->cancelled) waiting_.push_back(std::move(admitting_->pending));
  admitting_.reset();
}

void StateMachine::EndAdmission(TimePoint now, Deliveries* out) {
  const std::string host = admitting_->pending.node.hostname;
  members_.Erase(admitting_->pending.node.node_id);
  const bool cancelled = admitting_->cancelled;
  OpenRound(now,
            cancelled ? absl::StrCat("node ", host, " went away while it was being admitted")
                      : absl::StrCat(
                            "node ", host, " was not admitted into the running round within ",
                            config_.admit_timeout.count(), " ms (the new group's port never came)"),
            /*counts_as_restart=*/false, out);
}

void StateMachine::WatchEnded(const std::string& node_id, TimePoint now) {
  Member* found = members_.Find(node_id);
  if (state_.phase != Phase::kRunning || found == nullptr) return;
  Member& m = *found;
  if (!m.left) m.watch_ended = now;
}

void StateMachine::Heard(const std::string& node_id, TimePoint now) {
  Member* found = members_.Find(node_id);
  if (found == nullptr) return;
  Member& m = *found;
  m.last_seen = std::max(m.last_seen, now);
  m.watch_ended.reset();
}

}  // namespace dlrun::rdzv
