// Where is dlrun running? Slurm (srun, also srun --mpi=pmix), Open MPI (mpirun), another PMIx
// launcher (prterun, flux; asked through PMIx_Get), Kubeflow /
// Run:ai pods (PET_*, MASTER_ADDR, RANK as the pod index), torchrun-style variables, or nothing
// (standalone). Each environment has its own detector (findings.h), which only reads; this
// merges the first one's findings into a copy of the options, filling in only what the flags
// left unset. The options given are never changed.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/cli/options.h"
#include "launcher/detect/pmix_query.h"

namespace dlrun::launcher {

struct Detection {
  std::string source;  // slurm | openmpi | pmix | kubeflow | torchrun-env | standalone | flags
  std::string reason;  // one sentence: why this source
  std::vector<std::pair<std::string, std::string>> evidence;  // variables read, in order
  std::vector<std::pair<std::string, std::string>> applied;   // flag -> value filled in
  int slurm_node_id = -1;
  std::vector<std::string> expected_hosts;  // the step's hosts (Slurm), for rendezvous errors
  LaunchOptions options;  // the flags given, with what the environment filled in
};

// The flags `given`, their unset fields filled from the environment (Detection::options).
// Errors name the variable and value. `pmix` is asked only under a PMIx launcher that set no
// Slurm or Open MPI variables.
absl::StatusOr<Detection> DetectEnvironment(const EnvLookup& env, const LaunchOptions& given,
                                            const PmixQuery& pmix = QueryPmixServer);

// `dlrun env`: prints what was detected and why, as a table.
std::string FormatDetection(const Detection& d);

// Where the static backend's workers meet: --master-addr/--master-port, or, as torchrun,
// --rdzv-endpoint HOST[:PORT] when one is given.
std::pair<std::string, int> StaticMaster(const LaunchOptions& o);
// The static backend's --rdzv-endpoint (one HOST[:PORT], a port 0-65535) before StaticMaster
// reads it: a bad one is one line naming the flag, not a master "localhost:99999" handed to the
// workers or "cannot resolve 'host:abc'" said of --master-addr.
absl::Status CheckStaticEndpoint(const LaunchOptions& o);

}  // namespace dlrun::launcher
