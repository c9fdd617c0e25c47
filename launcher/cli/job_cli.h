// `dlrun slurm` and `dlrun runai`: their flags, parsed into the options the job generators
// (launcher/jobgen/) render. Errors name the flag, the bad value and what was expected.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/defaults.h"
#include "launcher/cli/flags.h"

namespace dlrun::launcher {

struct SlurmJobOptions : cli::CommandLine {
  int nodes = 1;
  // --min-nodes: the job goes on with at least this many nodes after losing some (elastic
  // `--nnodes MIN:N`, no kill on a node failure or a failed agent); 0: every node is needed.
  int min_nodes = 0;
  int gpus_per_node = 0;
  int nproc_per_node = 0;  // 0: one per GPU, or 1 without GPUs
  int cpus_per_task = 0;   // 0: 8 per GPU (the low end of 8-24 per GPU), or 1 per worker
  std::string time = "01:00:00";
  std::string job_name = "dlrun";
  std::string partition, account, constraint, qos, mem;
  // sbatch --exclude: the hosts given, then those of the user's bad-node list
  // (launcher/base/bad_nodes.h) that SlurmMain adds; `bad_nodes` counts the latter.
  std::string exclude;
  int bad_nodes = 0;
  std::string output = "dlrun-%j.out";
  std::vector<std::string> sbatch_options;  // extra "--opt=value" lines, verbatim
  bool preemptible = false;
  int signal_seconds = 90;  // --preemptible: SIGUSR1 this long before the end
  int rdzv_port = 0;  // 0: 20000 + SLURM_JOB_ID % 10000, computed in the script
  bool tls = false;     // the script makes a CA and certificate for the job (mutual TLS)
  std::string tls_dir;  // where (every node must see it); empty: $HOME/.dlrun/tls
  int max_restarts = defaults::kJobMaxRestarts;
  std::chrono::milliseconds hang_timeout{0};
  int metrics_port = 0;  // > 0: the job's telemetry page and /metrics on the first node
  std::string log_dir;
  // --profile, --profile-ranks, --profile-steps, --profile-args: checked as dlrun checks them,
  // and passed on as given (docs/PROFILING.md).
  std::string profile, profile_ranks, profile_steps, profile_args;
  // Containers (docs/PACKAGING.md): at most one of pyxis' --container-image, Slurm's own OCI
  // --container (a bundle directory) and Apptainer's image. The agent runs inside the container
  // and restarts its workers there.
  std::string container_image;    // pyxis/enroot: srun --container-image
  std::string container_mounts;   // SRC:DST[,...]: pyxis --container-mounts, Apptainer --bind
  std::string container_workdir;  // pyxis --container-workdir
  std::string container_bundle;   // srun --container=BUNDLE (oci.conf on the cluster)
  std::string apptainer_image;    // apptainer exec --nv IMAGE.sif
  std::string dlrun_path = "dlrun";  // in a container: /opt/dlrun/bin/dlrun (containers/Containerfile)
  std::string script_path;  // -o FILE; empty: stdout (or dlrun-<job-name>.sbatch with --submit)
  bool submit = false;
  std::vector<std::string> args;     // as given after `slurm`, for the script's header
};

// Parses `dlrun slurm [options] -- PROGRAM ARGS` (args after "slurm").
absl::StatusOr<SlurmJobOptions> ParseSlurmArgs(const std::vector<std::string>& args);
std::string SlurmUsage();
// What a pyxis image (--container-image) may lack, one line each for `dlrun slurm` to print: an
// image whose name is not dlrun's (scripts/build-image) probably has no /opt/dlrun/bin/dlrun
// unless --dlrun or a mount on /opt/dlrun says otherwise; a relative script path is looked up in
// the image's working directory (pyxis does not start in the submitting directory) unless
// --container-workdir says where.
std::vector<std::string> ContainerWarnings(const SlurmJobOptions& o);

struct RunaiJobOptions : cli::CommandLine {
  std::string name;
  std::string project;
  std::string image;
  int workers = 1;  // worker pods besides the master pod: nodes = workers + 1
  int gpus = 0;     // per pod
  int nproc_per_node = 0;  // 0: one per GPU, or 1 without GPUs
  std::string cpu;         // per pod, as Kubernetes quantities ("8", "500m"); empty: unset
  std::string memory;
  int rdzv_port = defaults::kRdzvPort;
  int max_restarts = defaults::kJobMaxRestarts;
  bool large_shm = false;
  bool legacy_cli = false;
  std::vector<std::string> env;  // K=V
  std::string dlrun_path = "dlrun";
  std::string manifest_path;  // -o FILE
  // Hosts the pods keep off (the manifest's node anti-affinity): the user's bad-node list
  // (launcher/base/bad_nodes.h), which RunaiMain fills in.
  std::vector<std::string> avoid_nodes;
  // Lines for stderr (e.g. a CPU request outside 8 to 24 per GPU); the command is still valid.
  std::vector<std::string> warnings;
};

// CPUs per pod, by default 8 per GPU (the DGX guide's lower bound: between 8 and 24 per GPU
// keeps the data loaders fed); a --cpu outside 8-24 per GPU is a warning.
inline constexpr int kRunaiCpusPerGpu = 8;
inline constexpr int kRunaiMaxCpusPerGpu = 24;

absl::StatusOr<RunaiJobOptions> ParseRunaiArgs(const std::vector<std::string>& args);
std::string RunaiUsage();

}  // namespace dlrun::launcher
