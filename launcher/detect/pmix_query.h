// What a PMIx server knows about this process's job (PMIx_Init + PMIx_Get), for launchers that
// start one dlrun per node through PMIx alone: PRRTE's prterun, Flux with pmix, srun --mpi=pmix
// with Slurm's own variables scrubbed. libpmix.so.2 is loaded with dlopen only when
// PMIX_NAMESPACE is set, so dlrun neither links nor needs it elsewhere.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::launcher {

struct PmixJob {
  std::string nspace;  // the job's namespace: the run id
  uint32_t rank = 0;   // this process (one dlrun per node: the node's place)
  std::optional<uint32_t> job_size;    // PMIX_JOB_SIZE
  std::optional<uint32_t> num_nodes;   // PMIX_NUM_NODES
  std::optional<uint32_t> local_size;  // PMIX_LOCAL_SIZE (processes of the job on this node)
  std::string rank0_host;              // PMIX_HOSTNAME of rank 0, "" when the server has none
  std::string node_list;               // PMIX_NODE_LIST (comma-separated), "" when none
};

using PmixQuery = std::function<absl::StatusOr<PmixJob>()>;

// Connects to the local PMIx server, reads the keys above and disconnects. Errors name the
// library or the PMIx call and its status string.
absl::StatusOr<PmixJob> QueryPmixServer();

}  // namespace dlrun::launcher
