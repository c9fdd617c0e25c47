// The environment each worker gets: torchrun's contract, so any torch.distributed program runs.
#pragma once

#include <map>
#include <string>

namespace dlrun::launcher {

// Where one node's workers sit in the job, as decided by the rendezvous (or static flags).
struct NodeAssignment {
  int node_rank = 0;
  int num_nodes = 1;
  int rank_offset = 0;  // global rank of local rank 0
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id = "none";
  std::string role = "default";
};

// Variables set for local rank `local_rank`. `error_file` becomes TORCHELASTIC_ERROR_FILE;
// `omp_threads` > 0 sets OMP_NUM_THREADS (callers pass 0 when the user set it).
std::map<std::string, std::string> BuildWorkerEnv(const NodeAssignment& a, int local_rank,
                                                  const std::string& error_file, int omp_threads);

}  // namespace dlrun::launcher
