// A torchrun-style static setup by hand: MASTER_ADDR, NODE_RANK (or GROUP_RANK) and NNODES.
#include "common/contract.h"
#include "common/scheduler_env.h"
#include "launcher/detect/findings.h"

namespace dlrun::launcher {

absl::StatusOr<std::optional<Findings>> DetectTorchrunEnv(const EnvLookup& env,
                                                          const GivenFlags&) {
  if (!env(contract::kMasterAddr) || !(env(sched::kNodeRank) || env(contract::kGroupRank)) ||
      !env(sched::kNnodes)) {
    return std::nullopt;
  }
  Findings f;
  EnvReader r(env, &f);
  f.source = "torchrun-env";
  f.reason = "MASTER_ADDR, NODE_RANK and NNODES are set (a torchrun-style static setup)";
  auto nn = r.Int(sched::kNnodes, 1);
  if (!nn.ok()) return nn.status();
  auto nr = r.Int(r.Has(sched::kNodeRank) ? sched::kNodeRank : contract::kGroupRank, 0);
  if (!nr.ok()) return nr.status();
  f.nodes = *nn;
  f.node_rank = *nr;
  f.master_addr = *r.Get(contract::kMasterAddr);
  auto port = r.Port(contract::kMasterPort);
  if (!port.ok()) return port.status();
  if (*port) f.master_port = **port;
  return f;
}

}  // namespace dlrun::launcher
