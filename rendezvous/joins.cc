// The open round's joins (joins.h).
#include "rendezvous/joins.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/roster.h"

namespace dlrun::rdzv {

void OpenJoins::Add(PendingJoin p, Deliveries* out) {
  auto it = index_.find(p.node.node_id);
  if (it != index_.end()) {
    PendingJoin& old = joins_[it->second];
    out->push_back(
        {std::move(old.cb), absl::AbortedError("superseded by a newer join from the same node")});
    old = std::move(p);
    return;
  }
  index_[p.node.node_id] = joins_.size();
  joins_.push_back(std::move(p));
}

bool OpenJoins::Cancel(const std::string& node_id, uint64_t ticket) {
  auto it = index_.find(node_id);
  if (it == index_.end() || joins_[it->second].ticket != ticket) return false;
  const size_t i = it->second;
  index_.erase(it);
  if (i + 1 != joins_.size()) {
    joins_[i] = std::move(joins_.back());
    index_[joins_[i].node.node_id] = i;
  }
  joins_.pop_back();
  return true;
}

std::vector<std::string> OpenJoins::LeaveOutSlow(double ratio, Deliveries* out) {
  std::vector<NodeInfo> nodes;
  for (const PendingJoin& p : joins_) nodes.push_back(p.node);
  const auto slow = SlowJoiners(nodes, ratio);
  std::vector<std::string> verdicts;
  if (slow.empty()) return verdicts;
  std::vector<PendingJoin> kept;
  for (size_t i = 0, k = 0; i < joins_.size(); ++i) {
    if (k == slow.size() || slow[k].first != i) {
      kept.push_back(std::move(joins_[i]));
      continue;
    }
    verdicts.push_back(slow[k++].second);
    out->push_back({std::move(joins_[i].cb), absl::FailedPreconditionError(absl::StrCat(
                                                 kLeftOutByPreflight, verdicts.back()))});
  }
  joins_ = std::move(kept);
  Reindex();
  return verdicts;
}

std::vector<PendingJoin> OpenJoins::TakeInRankOrder(const std::string& first) {
  const bool all_slurm = std::all_of(
      joins_.begin(), joins_.end(), [](const PendingJoin& p) { return p.node.slurm_node_id >= 0; });
  std::sort(joins_.begin(), joins_.end(), [&](const PendingJoin& a, const PendingJoin& b) {
    if (all_slurm && a.node.slurm_node_id != b.node.slurm_node_id) {
      return a.node.slurm_node_id < b.node.slurm_node_id;
    }
    if (!all_slurm && !first.empty() && (a.node.node_id == first) != (b.node.node_id == first)) {
      return a.node.node_id == first;
    }
    return NodeIdLess(a.node.node_id, b.node.node_id);
  });
  return TakeAll();
}

std::vector<PendingJoin> OpenJoins::TakeAll() {
  std::vector<PendingJoin> all = std::move(joins_);
  joins_.clear();
  index_.clear();
  return all;
}

std::string OpenJoins::Hosts() const {
  std::vector<std::string> hosts;
  for (const PendingJoin& p : joins_) hosts.push_back(p.node.hostname);
  std::sort(hosts.begin(), hosts.end());
  if (hosts.size() > 16) {
    hosts.resize(16);
    hosts.push_back("...");
  }
  return absl::StrJoin(hosts, ", ");
}

void OpenJoins::Reindex() {
  index_.clear();
  for (size_t i = 0; i < joins_.size(); ++i) index_[joins_[i].node.node_id] = i;
}

}  // namespace dlrun::rdzv
