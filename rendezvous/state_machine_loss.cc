// The state machine's lost members (state_machine.h): who is lost, and what the round does
// without them: a new round, the job's failure below min_nodes, or, when every survivor
// recovers in process, the same round at the smaller size (docs/RECOVERY.md, "A node lost").
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/state_machine.h"

namespace dlrun::rdzv {

std::optional<TimePoint> StateMachine::WatchLossAt(const Member& m) const {
  if (!m.in_process || m.left || !m.watch_ended || m.last_seen > *m.watch_ended) {
    return std::nullopt;
  }
  return *m.watch_ended + config_.watch_grace;
}

bool StateMachine::IsLost(const Member& m, TimePoint now) const {
  if (now - m.last_seen > config_.liveness_limit()) return true;
  const std::optional<TimePoint> at = WatchLossAt(m);
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
  members_ = std::move(alive);
  member_index_.clear();
  for (size_t i = 0; i < members_.size(); ++i) member_index_[members_[i].node.node_id] = i;
  const int survivors = static_cast<int>(members_.size() + waiting_.size());
  const std::string what =
      absl::StrCat("lost ", dead.size(), " node(s): ", absl::StrJoin(dead, ", "));
  if (survivors < config_.min_nodes) {
    ++round_;
    Fail(absl::StrCat(what, "; ", survivors, " node(s) left, below the minimum of ",
                      config_.min_nodes),
         out);
    return;
  }
  const bool in_process = !members_.empty() && waiting_.empty() &&
                          std::all_of(members_.begin(), members_.end(),
                                      [](const Member& m) { return m.in_process && !m.left; });
  if (in_process) {
    shrink_ = Shrink{round_, {}, 0, "", what};
    ShrinkRound(what);
    return;
  }
  OpenRound(now, what, /*counts_as_restart=*/true, out);
}

// The survivors keep their order (node ranks close up) and the round; rank 0's node, first
// among them, hosts the group's store.
void StateMachine::ShrinkRound(const std::string& what) {
  int offset = 0;
  for (size_t i = 0; i < members_.size(); ++i) {
    shrink_->places.push_back({members_[i].node.node_id, static_cast<int>(i), offset});
    offset += members_[i].node.nproc;
  }
  shrink_->world_size = offset;
  shrink_->master_addr = members_.front().node.address;
  restart_reason_ = what;
}

std::optional<Shrink> StateMachine::TakeShrink() {
  std::optional<Shrink> s = std::move(shrink_);
  shrink_.reset();
  return s;
}

void StateMachine::WatchEnded(const std::string& node_id, TimePoint now) {
  auto it = member_index_.find(node_id);
  if (phase_ != Phase::kRunning || it == member_index_.end()) return;
  Member& m = members_[it->second];
  if (!m.left) m.watch_ended = now;
}

void StateMachine::Heard(const std::string& node_id, TimePoint now) {
  auto it = member_index_.find(node_id);
  if (it == member_index_.end()) return;
  Member& m = members_[it->second];
  m.last_seen = std::max(m.last_seen, now);
  m.watch_ended.reset();
}

}  // namespace dlrun::rdzv
