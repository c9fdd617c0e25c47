// The environment each worker gets: torchrun's contract (common/contract.h), so any
// torch.distributed program runs.
#pragma once

#include <map>
#include <string>

#include "common/assignment.h"

namespace dlrun::launcher {

// Variables set for local rank `local_rank`. `error_file` becomes TORCHELASTIC_ERROR_FILE;
// `omp_threads` > 0 sets OMP_NUM_THREADS (callers pass 0 when the user set it);
// `virtual_local_rank` (torchrun 2.x's --virtual-local-rank) makes LOCAL_RANK 0 in every worker.
std::map<std::string, std::string> BuildWorkerEnv(const Assignment& a, int local_rank,
                                                  const std::string& error_file, int omp_threads,
                                                  bool virtual_local_rank = false);

}  // namespace dlrun::launcher
