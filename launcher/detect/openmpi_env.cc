// Open MPI: started by mpirun (OMPI_COMM_WORLD_*), one dlrun per node, a static rendezvous.
#include "common/contract.h"
#include "common/scheduler_env.h"
#include "launcher/detect/findings.h"

namespace dlrun::launcher {

absl::StatusOr<std::optional<Findings>> DetectOpenMpi(const EnvLookup& env, const GivenFlags& g) {
  if (!env(sched::kOmpiWorldSize)) return std::nullopt;
  Findings f;
  EnvReader r(env, &f);
  f.source = "openmpi";
  f.reason = "started by Open MPI's mpirun (OMPI_COMM_WORLD_* are set); one dlrun per node";
  auto size = r.Int(sched::kOmpiWorldSize, 1);
  if (!size.ok()) return size.status();
  auto rank = r.Int(sched::kOmpiWorldRank, 0);
  if (!rank.ok()) return rank.status();
  auto local_size = r.Int(sched::kOmpiLocalSize, 1);
  if (!local_size.ok()) return local_size.status();
  auto addr = r.Get(contract::kMasterAddr);
  if (!addr && *local_size != *size && !g.master_addr) {
    return absl::FailedPreconditionError(
        "under mpirun across nodes dlrun needs the address of rank 0: export MASTER_ADDR "
        "(mpirun -x MASTER_ADDR=host) or pass --master-addr");
  }
  f.nodes = *size;
  f.node_rank = *rank;
  f.rdzv_backend = RdzvBackend::kStatic;
  f.master_addr = addr.value_or("127.0.0.1");
  auto port = r.Port(contract::kMasterPort);
  if (!port.ok()) return port.status();
  if (*port) f.master_port = **port;
  if (auto job = r.Get(sched::kOmpiJobId)) f.rdzv_id = *job;
  return f;
}

}  // namespace dlrun::launcher
