// Another PMIx launcher (prterun, flux; srun --mpi=pmix without Slurm's variables): the job's
// layout comes from the PMIx server (PMIx_Get), one dlrun per node.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/scheduler_env.h"
#include "launcher/detect/findings.h"

namespace dlrun::launcher {

absl::StatusOr<std::optional<Findings>> DetectPmix(const EnvLookup& env, const GivenFlags& g,
                                                   const PmixQuery& pmix) {
  if (!env(sched::kPmixNamespace) || !env(sched::kPmixRank)) return std::nullopt;
  Findings f;
  EnvReader r(env, &f);
  f.source = "pmix";
  f.reason = "started by a PMIx launcher (PMIX_NAMESPACE and PMIX_RANK are set, no Slurm or "
             "Open MPI variables): the job's layout comes from PMIx_Get; one dlrun per node";
  r.Get(sched::kPmixNamespace);
  r.Get(sched::kPmixRank);
  auto job = pmix();
  if (!job.ok()) return job.status();
  const auto show = [&](const char* key, const std::optional<uint32_t>& v) {
    f.evidence.emplace_back(absl::StrCat("PMIx ", key), v ? absl::StrCat(*v) : "(none)");
  };
  f.evidence.emplace_back("PMIx namespace", job->nspace);
  f.evidence.emplace_back("PMIx rank", absl::StrCat(job->rank));
  show(sched::kPmixJobSize, job->job_size);
  show(sched::kPmixNumNodes, job->num_nodes);
  show(sched::kPmixLocalSize, job->local_size);
  f.evidence.emplace_back("PMIx PMIX_NODE_LIST", job->node_list.empty() ? "(none)" : job->node_list);
  f.evidence.emplace_back("PMIx PMIX_HOSTNAME (rank 0)",
                          job->rank0_host.empty() ? "(none)" : job->rank0_host);
  if (!job->job_size || *job->job_size < 1 || job->rank >= *job->job_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the PMIx server of namespace '", job->nspace, "' gave no valid PMIX_JOB_SIZE (rank ",
        job->rank, "): pass --nnodes, --node-rank and the rendezvous flags"));
  }
  const int nodes = static_cast<int>(*job->job_size);
  if (job->local_size && *job->local_size > 1) {
    f.reason += absl::StrCat("; note: ", *job->local_size,
                             " processes of the job share this node, dlrun wants one per node");
  }
  f.node_order = static_cast<int>(job->rank);  // agents line up in PMIx rank order
  f.rdzv_id = job->nspace;
  if (nodes == 1 && !g.placement) {
    f.standalone = "true (a one-process PMIx job)";
    return f;
  }
  std::vector<std::string> hosts;
  if (!job->node_list.empty()) hosts = absl::StrSplit(job->node_list, ',', absl::SkipEmpty());
  const std::string host0 = !job->rank0_host.empty() ? job->rank0_host
                            : hosts.empty()          ? ""
                                                     : hosts[0];
  if (host0.empty() && !g.rdzv_endpoint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the PMIx server of namespace '", job->nspace,
        "' knows neither PMIX_HOSTNAME of rank 0 nor PMIX_NODE_LIST: pass --rdzv-endpoint "
        "HOST:PORT of the node of PMIx rank 0"));
  }
  f.expected_hosts = hosts;
  f.nodes = nodes;
  f.rdzv_backend = RdzvBackend::kGrpc;
  auto port = r.RdzvPort();
  if (!port.ok()) return port.status();
  if (!host0.empty()) f.rdzv_endpoint = absl::StrCat(host0, ":", *port);
  return f;
}

}  // namespace dlrun::launcher
