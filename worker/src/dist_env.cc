#include "dlrun/dist_env.h"

#include "text.h"

#include <stdexcept>


#include <signal.h>

#include <cstdlib>
#include <limits>

#include "common/contract.h"
#include "common/env.h"
#include "common/local_address.h"
#include "common/scheduler_env.h"

namespace dlrun::worker {
namespace {

// Reads an integer variable in [lo, hi]; `required` makes absence an error.
lite::Status ReadInt(const EnvLookup& env, const std::string& name, int lo, int hi, bool required,
                     int* out) {
  std::optional<std::string> v = env(name);
  if (!v.has_value()) {
    if (!required) return lite::OkStatus();
    return lite::FailedPreconditionError(
        lite::StrCat("environment variable ", name, " is not set (expected an integer)"));
  }
  int x = 0;
  if (!lite::SimpleAtoi(*v, &x) || x < lo || x > hi) {
    return lite::InvalidArgumentError(lite::StrCat("environment variable ", name, "='", *v,
                                                   "' is invalid: expected an integer in [", lo,
                                                   ", ", hi, "]"));
  }
  *out = x;
  return lite::OkStatus();
}

constexpr int kMax = std::numeric_limits<int>::max();

#define DLRUN_RETURN_IF_ERROR(expr)          \
  do {                                       \
    if (lite::Status _s = (expr); !_s.ok()) { \
      return _s;                             \
    }                                        \
  } while (0)

}  // namespace

EnvLookup process_environment() { return dlrun::ProcessEnvironment(); }

namespace {

lite::StatusOr<DistEnv> Parse(const EnvLookup& env) {
  DistEnv d;
  std::string rank_var, size_var, local_var, local_size_var;
  if (env(contract::kRank) || env(contract::kWorldSize)) {
    d.source = "torchrun";
    rank_var = contract::kRank;
    size_var = contract::kWorldSize;
    local_var = contract::kLocalRank;
    local_size_var = contract::kLocalWorldSize;
  } else if (env(sched::kOmpiWorldRank)) {
    d.source = "openmpi";
    rank_var = sched::kOmpiWorldRank;
    size_var = sched::kOmpiWorldSize;
    local_var = sched::kOmpiLocalRank;
    local_size_var = sched::kOmpiLocalSize;
  } else if (env(sched::kSlurmProcId)) {
    d.source = "slurm";
    rank_var = sched::kSlurmProcId;
    size_var = sched::kSlurmNtasks;
    local_var = sched::kSlurmLocalId;
    local_size_var = sched::kSlurmNtasksPerNode;
  } else {
    d.source = "single";
    return d;
  }

  DLRUN_RETURN_IF_ERROR(ReadInt(env, size_var, 1, kMax, true, &d.world_size));
  DLRUN_RETURN_IF_ERROR(ReadInt(env, rank_var, 0, kMax, true, &d.rank));
  if (d.rank >= d.world_size) {
    return lite::InvalidArgumentError(lite::StrCat(rank_var, "=", d.rank, " is not below ",
                                                   size_var, "=", d.world_size));
  }
  d.local_rank = d.rank;
  d.local_world_size = d.world_size;
  DLRUN_RETURN_IF_ERROR(ReadInt(env, local_var, 0, kMax, d.source == "torchrun", &d.local_rank));
  DLRUN_RETURN_IF_ERROR(ReadInt(env, local_size_var, 1, kMax, false, &d.local_world_size));
  if (d.local_rank >= d.local_world_size) {
    return lite::InvalidArgumentError(lite::StrCat(local_var, "=", d.local_rank, " is not below ",
                                                   local_size_var, "=", d.local_world_size));
  }
  if (d.source == "torchrun") {
    DLRUN_RETURN_IF_ERROR(ReadInt(env, contract::kGroupRank, 0, kMax, false, &d.group_rank));
    DLRUN_RETURN_IF_ERROR(
        ReadInt(env, contract::kRestartCount, 0, kMax, false, &d.restart_count));
    if (auto id = env(contract::kRunId)) d.run_id = *id;
  } else if (d.source == "openmpi") {
    DLRUN_RETURN_IF_ERROR(ReadInt(env, sched::kOmpiNodeRank, 0, kMax, false, &d.group_rank));
  } else {
    DLRUN_RETURN_IF_ERROR(ReadInt(env, sched::kSlurmNodeId, 0, kMax, false, &d.group_rank));
    DLRUN_RETURN_IF_ERROR(ReadInt(env, sched::kSlurmRestartCount, 0, kMax, false, &d.restart_count));
    if (auto id = env(sched::kSlurmJobId)) d.run_id = *id;
  }

  // The store address: always MASTER_ADDR / MASTER_PORT when set (dlrun and torchrun set them).
  std::optional<std::string> addr = env(contract::kMasterAddr);
  if (addr.has_value()) {
    if (addr->empty()) {
      return lite::InvalidArgumentError("environment variable MASTER_ADDR is empty");
    }
    d.master_addr = *addr;
  } else if (d.world_size > 1 && d.source == "torchrun") {
    return lite::FailedPreconditionError(
        "environment variable MASTER_ADDR is not set (expected the address of rank 0)");
  } else if (d.world_size > 1 && d.source == "slurm") {
    // srun alone: rank 0 runs where srun was launched from only for single-node steps; ask
    // for MASTER_ADDR explicitly when the step spans nodes.
    auto nodes = env(sched::kSlurmStepNumNodes);
    if (nodes.has_value() && *nodes != "1") {
      return lite::FailedPreconditionError(
          "environment variable MASTER_ADDR is not set: a multi-node srun step needs the "
          "address of the node of rank 0 (e.g. the first host of SLURM_JOB_NODELIST)");
    }
  }
  DLRUN_RETURN_IF_ERROR(
      ReadInt(env, contract::kMasterPort, 1, 65535, d.world_size > 1 && d.source == "torchrun",
              &d.master_port));
  return d;
}

}  // namespace

DistEnv parse_dist_env(const EnvLookup& env) {
  lite::StatusOr<DistEnv> d = Parse(env);
  if (!d.ok()) throw std::invalid_argument(std::string(d.status().message()));
  return *d;
}

std::string local_address_for(const std::string& host) { return LocalAddressFor(host); }

bool ignore_sigpipe_unless_handled() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) != 0) return false;
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return false;
  return signal(SIGPIPE, SIG_IGN) != SIG_ERR;
}

}  // namespace dlrun::worker
