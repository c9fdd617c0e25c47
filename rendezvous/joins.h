// The joins the rendezvous holds (state_machine.h): a join is a pending reply, its callback run
// with the node's Assignment (or an error) when the round it lands in closes. OpenJoins is the
// open round's joins, one per node; bookkeeping only: the StateMachine decides when they close.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/types.h"

namespace dlrun::rdzv {

using JoinCallback = std::function<void(absl::StatusOr<Assignment>)>;
struct Delivery {
  JoinCallback callback;
  absl::StatusOr<Assignment> result;
};
using Deliveries = std::vector<Delivery>;

struct PendingJoin {
  NodeInfo node;
  uint64_t ticket = 0;  // this call's, for a cancel
  JoinCallback cb;
};

class OpenJoins {
 public:
  // The same node joined again (its agent retried): the newer call replaces the older one, which
  // is answered "superseded".
  void Add(PendingJoin p, Deliveries* out);
  // The join of `node_id` with `ticket` is forgotten (its caller went away); false if none.
  bool Cancel(const std::string& node_id, uint64_t ticket);
  bool Has(const std::string& node_id) const { return index_.count(node_id) > 0; }
  // The preflight (SlowJoiners): the nodes far under the median leave with their verdict as the
  // error; the verdicts, none when every node may stay.
  std::vector<std::string> LeaveOutSlow(double ratio, Deliveries* out);
  // In node-rank order, and no longer held: by Slurm node id when every node knows it; else the
  // node `first_node_id` (the hosting agent: the rendezvous and MASTER_ADDR on one machine, as
  // under torchrun), then by node id (NodeIdLess).
  std::vector<PendingJoin> TakeInRankOrder(const std::string& first_node_id);
  // Every join, no longer held (a failure answers them).
  std::vector<PendingJoin> TakeAll();
  // The host names, sorted, at most 16 (for a line).
  std::string Hosts() const;
  size_t size() const { return joins_.size(); }

 private:
  void Reindex();

  std::vector<PendingJoin> joins_;
  std::unordered_map<std::string, size_t> index_;
};

// preflight_round.cc: of the nodes closing a round, those far under its median compute probe
// (by index in `joining`, with the line that says so); none when two share a host (their probes
// measure each other).
std::vector<std::pair<size_t, std::string>> SlowJoiners(const std::vector<NodeInfo>& joining,
                                                        double ratio);

}  // namespace dlrun::rdzv
