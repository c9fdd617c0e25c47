// What one environment (Slurm, Open MPI, PMIx, a Kubeflow/Run:ai pod, torchrun-style
// variables) says about the job: the settings it would fill in and the facts behind them. Each
// detector (launcher/detect/*_env.cc) only reads; env_detect.cc merges the findings into the
// options, where the command line always wins.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "launcher/cli/options.h"  // RdzvBackend
#include "launcher/detect/pmix_query.h"

namespace dlrun::launcher {

struct Findings {
  std::string source;  // slurm | openmpi | pmix | kubeflow | torchrun-env
  std::string reason;  // one sentence: why this source
  std::vector<std::pair<std::string, std::string>> evidence;  // variables read, in order
  // Settings, each filled in unless its flag was given.
  std::optional<std::string> rdzv_id, rdzv_endpoint, master_addr;
  std::optional<RdzvBackend> rdzv_backend;
  std::optional<int> nodes, node_rank, master_port;
  std::string standalone;  // non-empty: run standalone, and why ("a one-node step")
  // Facts for the rendezvous: this agent's place in the scheduler's order, the hosts expected.
  int node_order = -1;
  std::vector<std::string> expected_hosts;
};

// What the detectors need to know of the command line.
struct GivenFlags {
  bool placement = false;      // --rdzv-endpoint, --master-addr or --node-rank
  bool rdzv_endpoint = false;
  bool master_addr = false;
  bool nnodes = false;
  bool node_rank = false;      // --node-rank
  bool rdzv_asked = false;     // --rdzv-backend other than static
};

// Reads variables for a detector, noting each one found as evidence.
class EnvReader {
 public:
  EnvReader(const EnvLookup& env, Findings* f) : env_(env), f_(f) {}
  bool Has(const std::string& name) const { return env_(name).has_value(); }
  std::optional<std::string> Get(const std::string& name);
  // An integer >= lo; unset or bad: an error naming the variable and value.
  absl::StatusOr<int> Int(const std::string& name, int lo);
  // A port 1-65535 from `name` (unset: nullopt); bad: an error naming it.
  absl::StatusOr<std::optional<int>> Port(const std::string& name);
  // contract::kRdzvPort, the rendezvous port when dlrun derives the endpoint (default 29400).
  absl::StatusOr<int> RdzvPort();

 private:
  const EnvLookup& env_;
  Findings* f_;
};

// Each returns nullopt when dlrun is not running under that environment.
absl::StatusOr<std::optional<Findings>> DetectSlurm(const EnvLookup& env, const GivenFlags& g);
absl::StatusOr<std::optional<Findings>> DetectOpenMpi(const EnvLookup& env, const GivenFlags& g);
absl::StatusOr<std::optional<Findings>> DetectPmix(const EnvLookup& env, const GivenFlags& g,
                                                   const PmixQuery& pmix);
absl::StatusOr<std::optional<Findings>> DetectPod(const EnvLookup& env, const GivenFlags& g);
absl::StatusOr<std::optional<Findings>> DetectTorchrunEnv(const EnvLookup& env,
                                                          const GivenFlags& g);

}  // namespace dlrun::launcher
