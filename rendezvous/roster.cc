#include "rendezvous/roster.h"

#include <algorithm>

#include "common/host_port.h"

namespace dlrun::rdzv {

const Roster::Member* Roster::Find(const std::string& node_id) const {
  auto it = index_.find(node_id);
  return it == index_.end() ? nullptr : &members_[it->second];
}

Roster::Member* Roster::Find(const std::string& node_id) {
  auto it = index_.find(node_id);
  return it == index_.end() ? nullptr : &members_[it->second];
}

std::optional<size_t> Roster::IndexOf(const std::string& node_id) const {
  auto it = index_.find(node_id);
  return it == index_.end() ? std::nullopt : std::optional<size_t>(it->second);
}

void Roster::Add(Member m) {
  index_[m.node.node_id] = members_.size();
  members_.push_back(std::move(m));
}

void Roster::Replace(std::vector<Member> kept) {
  members_ = std::move(kept);
  index_.clear();
  for (size_t i = 0; i < members_.size(); ++i) index_[members_[i].node.node_id] = i;
}

void Roster::Erase(const std::string& node_id) {
  const std::optional<size_t> i = IndexOf(node_id);
  if (!i) return;
  std::vector<Member> kept = std::move(members_);
  kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(*i));
  Replace(std::move(kept));
}

void Roster::Clear() {
  members_.clear();
  index_.clear();
}

std::map<std::string, std::string> Roster::Live() const {
  std::map<std::string, std::string> out;
  for (const Member& m : members_) {
    if (!m.left) out[m.node.node_id] = m.node.hostname;
  }
  return out;
}

int Roster::WorldSize() const {
  int n = 0;
  for (const Member& m : members_) n += m.node.nproc;
  return n;
}

void Roster::Heard(const std::string& node_id, TimePoint now) {
  if (Member* m = Find(node_id)) {
    m->last_seen = std::max(m->last_seen, now);
    m->watch_ended.reset();
  }
}

void Roster::WatchEnded(const std::string& node_id, TimePoint now) {
  if (Member* m = Find(node_id); m != nullptr && !m->left) m->watch_ended = now;
}

std::vector<Assignment> Roster::Assignments(uint64_t round, int restart_count,
                                            int master_port) const {
  const int world = WorldSize();
  std::vector<Assignment> out(members_.size());
  int offset = 0;
  for (size_t i = 0; i < members_.size(); ++i) {
    Assignment& a = out[i];
    a.round = round;
    a.node_rank = static_cast<int>(i);
    a.num_nodes = static_cast<int>(members_.size());
    a.rank_offset = offset;
    a.world_size = world;
    a.local_world_size = members_[i].node.nproc;
    a.master_addr = members_.front().node.address;
    a.master_port = master_port;
    a.restart_count = restart_count;
    offset += members_[i].node.nproc;
  }
  return out;
}

std::vector<Successor> Roster::Successors(const std::string& exclude) const {
  std::vector<Successor> out;
  for (const Member& m : members_) {
    if (out.size() >= kMaxSuccessors) break;
    if (m.node.node_id == exclude) continue;
    out.push_back({m.node.node_id, m.node.address});
  }
  return out;
}

void Roster::Place(Resize* r) const {
  int offset = 0;
  for (size_t i = 0; i < members_.size(); ++i) {
    r->places.push_back({members_[i].node.node_id, static_cast<int>(i), offset});
    offset += members_[i].node.nproc;
  }
  r->world_size = offset;
  r->master_addr = members_.front().node.address;
}

bool Roster::AllRecoverInProcess() const {
  return !members_.empty() && std::all_of(members_.begin(), members_.end(),
                                          [](const Member& m) { return m.in_process && !m.left; });
}

std::optional<TimePoint> WatchLossAt(const Roster::Member& m, Duration watch_grace) {
  if (!m.in_process || m.left || !m.watch_ended || m.last_seen > *m.watch_ended) {
    return std::nullopt;
  }
  return *m.watch_ended + watch_grace;
}

bool NodeIdLess(const std::string& a, const std::string& b) {
  const HostPort x = SplitHostPort(a), y = SplitHostPort(b);
  auto digits = [](const HostPort& h) {
    return h.has_port && !h.port.empty() && h.port.find_first_not_of("0123456789") == std::string::npos;
  };
  if (digits(x) && digits(y) && x.host == y.host && x.port.size() != y.port.size()) {
    return x.port.size() < y.port.size();  // no leading zeros in a pid: the shorter number is smaller
  }
  return a < b;
}

}  // namespace dlrun::rdzv
