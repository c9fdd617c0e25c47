#include "launcher/worker_env.h"

namespace dlrun::launcher {

std::map<std::string, std::string> BuildWorkerEnv(const NodeAssignment& a, int local_rank,
                                                  const std::string& error_file, int omp_threads) {
  const std::string rank = std::to_string(a.rank_offset + local_rank);
  std::map<std::string, std::string> env = {
      {"RANK", rank},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"GROUP_RANK", std::to_string(a.node_rank)},
      {"ROLE_RANK", rank},
      {"ROLE_NAME", a.role},
      {"LOCAL_WORLD_SIZE", std::to_string(a.local_world_size)},
      {"WORLD_SIZE", std::to_string(a.world_size)},
      {"GROUP_WORLD_SIZE", std::to_string(a.num_nodes)},
      {"ROLE_WORLD_SIZE", std::to_string(a.world_size)},
      {"MASTER_ADDR", a.master_addr},
      {"MASTER_PORT", std::to_string(a.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(a.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(a.max_restarts)},
      {"TORCHELASTIC_RUN_ID", a.run_id},
      // Workers create the c10d store themselves (rank 0 hosts it); dlrun's agent has none.
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"NCCL_ASYNC_ERROR_HANDLING", "1"},
  };
  if (!error_file.empty()) env["TORCHELASTIC_ERROR_FILE"] = error_file;
  if (omp_threads > 0) env["OMP_NUM_THREADS"] = std::to_string(omp_threads);
  return env;
}

}  // namespace dlrun::launcher
