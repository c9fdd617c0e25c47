#include "launcher/workers/worker_env.h"

#include "common/contract.h"

namespace dlrun::launcher {

std::map<std::string, std::string> BuildWorkerEnv(const Assignment& a, int local_rank,
                                                  const std::string& error_file, int omp_threads,
                                                  bool virtual_local_rank) {
  namespace c = contract;
  const std::string rank = std::to_string(a.rank_offset + local_rank);
  std::map<std::string, std::string> env = {
      {c::kRank, rank},
      {c::kLocalRank, std::to_string(virtual_local_rank ? 0 : local_rank)},
      {c::kGroupRank, std::to_string(a.node_rank)},
      {c::kRoleRank, rank},
      {c::kRoleName, a.role},
      {c::kLocalWorldSize, std::to_string(a.local_world_size)},
      {c::kWorldSize, std::to_string(a.world_size)},
      {c::kGroupWorldSize, std::to_string(a.num_nodes)},
      {c::kRoleWorldSize, std::to_string(a.world_size)},
      {c::kMasterAddr, a.master_addr},
      {c::kMasterPort, std::to_string(a.master_port)},
      {c::kRestartCount, std::to_string(a.restart_count)},
      {c::kMaxRestarts, std::to_string(a.max_restarts)},
      {c::kRunId, a.run_id},
      // Workers create the c10d store themselves (rank 0 hosts it); dlrun's agent has none.
      {c::kUseAgentStore, "False"},
      {c::kNcclAsyncErrorHandling, "1"},
      {c::kNcclAsyncErrorHandlingOld, "1"},
      {c::kNcclErrorHandlingDefault, "1"},
  };
  if (!error_file.empty()) env[c::kErrorFile] = error_file;
  if (omp_threads > 0) env[c::kOmpNumThreads] = std::to_string(omp_threads);
  return env;
}

}  // namespace dlrun::launcher
