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
};

}  // namespace dlrun::launcher
