// One node's place in the job, the one type from the rendezvous (or the static flags) to the
// worker environment: the rendezvous state machine fills the round, ranks, sizes and master,
// the agent adds what it knows (max_restarts, run_id, role) and BuildWorkerEnv turns it into
// the torchrun variables of common/contract.h. Plain data, no dependencies.
#pragma once

#include <cstdint>
#include <string>

#include "common/defaults.h"

namespace dlrun {

struct Assignment {
  uint64_t round = 0;    // the rendezvous round (0 for a static job)
  int node_rank = 0;     // GROUP_RANK
  int num_nodes = 1;     // GROUP_WORLD_SIZE
  int rank_offset = 0;   // global rank of this node's local rank 0
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = defaults::kMasterPort;
  int restart_count = 0;
  // > 0: this node was admitted into a running group at this generation of its in-process
  // recovery (docs/RECOVERY.md, "A node that joins"): every local rank takes the state from a
  // peer, and master_port is that generation's.
  int recovery_generation = 0;
  int max_restarts = 0;
  std::string run_id = "none";
  std::string role = "default";
};

}  // namespace dlrun
