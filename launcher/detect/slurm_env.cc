// Slurm: inside a step (srun; also srun --mpi=pmix), one dlrun per node.
#include "absl/strings/str_cat.h"
#include "common/scheduler_env.h"
#include "launcher/detect/findings.h"
#include "launcher/detect/hostlist.h"

namespace dlrun::launcher {

absl::StatusOr<std::optional<Findings>> DetectSlurm(const EnvLookup& env, const GivenFlags& g) {
  if (!env(sched::kSlurmJobId) || !env(sched::kSlurmProcId)) return std::nullopt;
  Findings f;
  EnvReader r(env, &f);
  f.source = "slurm";
  f.reason = "inside a Slurm step (SLURM_JOB_ID and SLURM_PROCID are set); one dlrun per node";
  const std::string job = *r.Get(sched::kSlurmJobId);
  auto nodes =
      r.Int(r.Has(sched::kSlurmStepNumNodes) ? sched::kSlurmStepNumNodes : sched::kSlurmJobNumNodes, 1);
  if (!nodes.ok()) return nodes.status();
  auto nodeid = r.Int(sched::kSlurmNodeId, 0);
  if (!nodeid.ok()) return nodeid.status();
  f.node_order = *nodeid;
  if (auto ntasks = env(sched::kSlurmNtasks); ntasks && *ntasks != absl::StrCat(*nodes)) {
    r.Get(sched::kSlurmNtasks);
    f.reason += "; note: SLURM_NTASKS differs from the node count, dlrun wants "
                "--ntasks-per-node=1";
  }
  f.rdzv_id = job;
  if (*nodes == 1 && !g.placement) {
    f.standalone = "true (a one-node step)";
    return f;
  }
  const std::string list_var =
      r.Has(sched::kSlurmStepNodelist) ? sched::kSlurmStepNodelist : sched::kSlurmJobNodelist;
  auto list = r.Get(list_var);
  if (!list) {
    return absl::FailedPreconditionError(
        "inside Slurm but SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset");
  }
  auto hosts = ExpandHostlist(*list);
  if (!hosts.ok()) return hosts.status();
  f.expected_hosts = *hosts;
  f.nodes = *nodes;
  f.rdzv_backend = RdzvBackend::kGrpc;
  auto port = r.RdzvPort();
  if (!port.ok()) return port.status();
  f.rdzv_endpoint = absl::StrCat((*hosts)[0], ":", *port);
  return f;
}

}  // namespace dlrun::launcher
