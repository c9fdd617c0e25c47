// Reads where this process sits in a distributed job from its environment: dlrun / torchrun
// (RANK, WORLD_SIZE, ...), Open MPI's mpirun (OMPI_COMM_WORLD_*), or srun alone (SLURM_PROCID...).
// No LibTorch here, so it is cheap to include and to test.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>


namespace dlrun::worker {

// The same type as the launcher's dlrun::EnvLookup (common/env.h, not installed).
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;
EnvLookup process_environment();

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;  // node rank
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // common/defaults.h kMasterPort (checked by dist_env_test)
  int restart_count = 0;
  std::string run_id = "none";
  std::string source;  // "torchrun" (dlrun or torchrun), "openmpi", "slurm" or "single"
};

// Throws std::invalid_argument with a one-line message naming the variable and the bad value
// when the environment is incomplete or inconsistent (e.g. RANK >= WORLD_SIZE). A process with
// no launcher variables at all is a single-process job (world size 1).
DistEnv parse_dist_env(const EnvLookup& env);

// The local IPv4 address this host uses to reach `host` (a name or address), or "" when it
// cannot be resolved or routed. No packet is sent.
std::string local_address_for(const std::string& host);

// Sets SIGPIPE to be ignored when its disposition is the default (which kills the process at a
// write to a socket or pipe whose reader is gone), as Python does at its start; a handler or an
// ignore the program set is kept. init() calls it (InitOptions::ignore_sigpipe). Returns whether
// it changed the disposition.
bool ignore_sigpipe_unless_handled();

}  // namespace dlrun::worker
