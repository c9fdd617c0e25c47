// A Kubeflow PyTorchJob / Run:ai pod: PET_* (the operator's elastic policy), or MASTER_ADDR with
// RANK as the pod index; one dlrun per pod.
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "common/scheduler_env.h"
#include "launcher/detect/findings.h"

namespace dlrun::launcher {

absl::StatusOr<std::optional<Findings>> DetectPod(const EnvLookup& env, const GivenFlags& g) {
  const bool pod = env(sched::kPetNnodes) || env(sched::kPetNodeRank) ||
                   env(sched::kPetRdzvEndpoint) ||
                   (env(contract::kMasterAddr) && env(contract::kRank) &&
                    env(contract::kWorldSize) && !env(contract::kLocalRank) &&
                    env(sched::kPodIndex));
  if (!pod) return std::nullopt;
  Findings f;
  EnvReader r(env, &f);
  f.source = "kubeflow";
  f.reason = "in a Kubeflow PyTorchJob / Run:ai pod (PET_* or MASTER_ADDR + RANK as the pod "
             "index are set); one dlrun per pod";
  for (const char* v : {sched::kPetNnodes, sched::kPetNodeRank, sched::kPetNprocPerNode,
                        sched::kPetRdzvEndpoint, sched::kJobName, sched::kJobUuid,
                        sched::kPodIndex}) {
    r.Get(v);
  }
  // The pod's index orders the agents at the rendezvous (master pod first), like SLURM_NODEID.
  for (const char* v : {sched::kPodIndex, sched::kPetNodeRank, contract::kRank}) {
    int idx = 0;
    if (auto val = env(v); val && absl::SimpleAtoi(*val, &idx) && idx >= 0) {
      f.node_order = idx;
      break;
    }
  }
  if (env(sched::kPetRdzvEndpoint)) {
    // --rdzv-endpoint itself comes from PET_RDZV_ENDPOINT through the flag table.
    f.rdzv_backend = RdzvBackend::kGrpc;
  } else if (g.rdzv_asked && !g.rdzv_endpoint) {
    // `dlrun runai` pods: --rdzv-backend grpc and the master pod hosts the rendezvous.
    auto addr = r.Get(contract::kMasterAddr);
    if (!addr) {
      return absl::FailedPreconditionError(
          "in a pod with --rdzv-backend grpc but MASTER_ADDR is unset: pass --rdzv-endpoint "
          "HOST:PORT of the pod that hosts the rendezvous");
    }
    auto port = r.RdzvPort();
    if (!port.ok()) return port.status();
    f.rdzv_endpoint = absl::StrCat(*addr, ":", *port);
  } else if (!g.rdzv_asked) {
    // The operator's RANK is the pod index (master 0, worker i -> i+1), not a process rank.
    const char* index = r.Has(sched::kPetNodeRank) ? sched::kPetNodeRank
                        : r.Has(contract::kRank)   ? contract::kRank
                                                   : nullptr;
    if (index) {
      auto rank = r.Int(index, 0);
      if (!rank.ok()) return rank.status();
      f.node_rank = *rank;
    } else if (!g.node_rank) {
      return absl::FailedPreconditionError(
          "in a Kubeflow PyTorchJob / Run:ai pod (PET_* set) but neither PET_NODE_RANK nor RANK "
          "(the pod's index, the master pod 0) is set: set one, or pass --node-rank N, or "
          "--rdzv-backend c10d with --rdzv-endpoint HOST:PORT");
    }
    if (!g.nnodes && r.Has(contract::kWorldSize)) {
      // WORLD_SIZE is replicas in older operators and replicas x nproc in newer ones.
      auto ws = r.Int(contract::kWorldSize, 1);
      if (!ws.ok()) return ws.status();
      f.nodes = *ws;
    }
    f.rdzv_backend = RdzvBackend::kStatic;
    if (auto addr = r.Get(contract::kMasterAddr)) f.master_addr = *addr;
    auto port = r.Port(contract::kMasterPort);
    if (!port.ok()) return port.status();
    if (*port) f.master_port = **port;
  }
  if (auto id = env(sched::kJobUuid)) f.rdzv_id = *id;
  return f;
}

}  // namespace dlrun::launcher
