// The last closed round's members, by node rank (state_machine.h): each node's identity, when
// it was last heard from, whether it left and whether its workers recover in process, with an
// index by node id. Plain bookkeeping: the StateMachine decides what changes.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/types.h"

namespace dlrun::rdzv {

class Roster {
 public:
  struct Member {
    NodeInfo node;
    TimePoint last_seen;
    bool left = false;
    bool in_process = false;               // its workers declared in-process recovery
    std::optional<TimePoint> watch_ended;  // its regroup watch's caller went away
  };

  const Member* Find(const std::string& node_id) const;
  Member* Find(const std::string& node_id);
  // Its node rank; nullopt for no member.
  std::optional<size_t> IndexOf(const std::string& node_id) const;
  void Add(Member m);  // the last node rank
  // The members become `kept`, in that order (a loss).
  void Replace(std::vector<Member> kept);
  void Erase(const std::string& node_id);
  void Clear();
  // `node_id` (if a member) was heard from at `now`: a regroup watch's end is forgotten.
  void Heard(const std::string& node_id, TimePoint now);
  // `node_id`'s regroup watch ended at `now` (unless it left: then it is not waited for).
  void WatchEnded(const std::string& node_id, TimePoint now);

  std::vector<Member>::iterator begin() { return members_.begin(); }
  std::vector<Member>::iterator end() { return members_.end(); }
  std::vector<Member>::const_iterator begin() const { return members_.begin(); }
  std::vector<Member>::const_iterator end() const { return members_.end(); }
  size_t size() const { return members_.size(); }
  bool empty() const { return members_.empty(); }
  const Member& front() const { return members_.front(); }
  const Member& operator[](size_t i) const { return members_[i]; }

  // The members that have not left: node id -> host name.
  std::map<std::string, std::string> Live() const;
  // Their nproc summed: the round's world size.
  int WorldSize() const;
  // In node-rank order, `exclude` (the host's node id) left out, at most kMaxSuccessors: who
  // may host next if the host is lost (docs/FAILOVER.md).
  std::vector<Successor> Successors(const std::string& exclude) const;
  // Each member's place in `r` (node id, node rank, rank offset), the world size and the
  // master address (the first member's): the members keep their order (node ranks close up
  // after a loss; an admitted node comes last).
  void Place(Resize* r) const;
  // Each member's Assignment, by node rank: its ranks in the world of all members, the first
  // member's address as the master's with `master_port`.
  std::vector<Assignment> Assignments(uint64_t round, int restart_count, int master_port) const;
  // Every member's workers declared in-process recovery and none has left (false when empty).
  bool AllRecoverInProcess() const;

 private:
  std::vector<Member> members_;
  std::unordered_map<std::string, size_t> index_;
};

// When a member that recovers in process is lost because its regroup watch ended and nothing
// was heard from it since (`watch_grace` after the end); nullopt when that does not apply.
std::optional<TimePoint> WatchLossAt(const Roster::Member& m, Duration watch_grace);

// The order of node ids in a round: "host:987" before "host:1001" (ids that share the text
// before their last ':' and end in digits compare those digits as numbers), else as text.
bool NodeIdLess(const std::string& a, const std::string& b);

}  // namespace dlrun::rdzv
