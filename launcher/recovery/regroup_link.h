// In-process recovery across nodes (docs/RECOVERY.md, "Across nodes"): how the agents of a
// multi-node job agree on their group's next generation. Over dlrun's rendezvous it is the
// proto's `service Regroup` (launcher/rdzv/rdzv_regroup.h); a single-node job needs none.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::launcher {

class RegroupLink {
 public:
  // The running round's latest regroup: generation 0 when none; master_port 0 until the node of
  // global rank 0 posted the new group's port.
  struct Notice {
    int generation = 0;
    int master_port = 0;
    std::vector<int> lost_ranks;
    std::string reason;    // the asking node's one line
    std::string asked_by;  // its node id
    // A node lost and the survivors going on without it: each remaining node's place (node id,
    // node rank, rank offset), the new world size and master address. Empty: nothing moved.
    struct Place {
      std::string node_id;
      int node_rank = 0;
      int rank_offset = 0;
      bool operator==(const Place&) const = default;
    };
    std::vector<Place> places;
    int world_size = 0;
    std::string master_addr;
    bool operator==(const Notice&) const = default;
  };
  virtual ~RegroupLink() = default;
  // Watches the running round's regroups (this round and each later one); `wake` runs on another
  // thread whenever Latest() changed.
  virtual void Watch(std::function<void()> wake) = 0;
  virtual Notice Latest() = 0;
  // This node lost `lost_ranks`: asks the job for `generation` (the current one + 1); or, with
  // `lost_ranks` empty, posts `master_port` for it (the node of global rank 0 picks the port, and
  // sends it with its own ask). The answer is the regroup as it stands; an error: refused (another
  // regroup came first, the round is over, the rendezvous is unreachable): restart instead.
  virtual absl::StatusOr<Notice> Ask(int generation, const std::vector<int>& lost_ranks,
                                     int master_port, const std::string& reason) = 0;
  // Every worker of this node declared in-process recovery: the job may then go on without a
  // lost node instead of opening a new round (said with the node's heartbeats).
  virtual void SetInProcess(bool in_process) = 0;
  // This node's id in the job (Notice::places names nodes by it).
  virtual std::string node_id() const = 0;
};

}  // namespace dlrun::launcher
