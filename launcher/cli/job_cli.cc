#include "launcher/cli/job_cli.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/cli/flags.h"
#include "launcher/base/profile_spec.h"

namespace dlrun::launcher {

using cli::WordField;

namespace {

using O = SlurmJobOptions;

// A flag passed on to dlrun as given, once dlrun's own parser accepts it.
const auto Checked = [](std::string O::*field, absl::Status (*check)(const std::string&)) {
  return [field, check](O& o, const std::string& v) {
    if (absl::Status s = check(v); !s.ok()) return s;
    o.*field = v;
    return absl::OkStatus();
  };
};
const auto SetTime = [](O& o, const std::string& v) {
  // sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
  bool ok = !v.empty() && v.size() < 16;
  for (char c : v) ok = ok && (absl::ascii_isdigit(c) || c == ':' || c == '-');
  if (!ok || !absl::ascii_isdigit(v.front()) || !absl::ascii_isdigit(v.back())) {
    return cli::BadValue("time", v, "a Slurm time limit such as 30, 04:00:00 or 1-12:00:00");
  }
  o.time = v;
  return absl::OkStatus();
};
const auto AddSbatchOption = [](O& o, const std::string& v) {
  if (!absl::StartsWith(v, "--") || v.find('\n') != std::string::npos) {
    return cli::BadValue("sbatch-option", v, "one sbatch option such as --mail-type=END");
  }
  o.sbatch_options.push_back(v);
  return absl::OkStatus();
};
const auto SetTlsDir = [](O& o, const std::string& v) {
  if (v.empty() || v.find_first_of("\n\r") != std::string::npos) {
    return cli::BadValue("tls-dir", v, "a directory path that every node of the job can read");
  }
  o.tls_dir = v;
  o.tls = true;
  return absl::OkStatus();
};
// An enroot/pyxis image reference: "nvcr.io#nvidia/pytorch:24.01" has a '#', which the script
// quotes; blanks, quotes, '$' and '\\' are refused.
const auto SetContainerImage = [](O& o, const std::string& v) {
  if (v.empty() || v.find_first_of(" \t\n\r'\"$\\`") != std::string::npos) {
    return cli::BadValue("container-image", v,
                         "an image reference such as nvcr.io#nvidia/pytorch:24.01 or a .sqsh file");
  }
  o.container_image = v;
  return absl::OkStatus();
};

// `dlrun slurm`'s flags, as sbatch names them where sbatch has them.
const std::vector<cli::Flag<SlurmJobOptions>> kSlurmFlags = {
    {"nodes", "N", true, cli::IntField<O>("nodes", &O::nodes, 1, 100000), "nodes (as sbatch -N; default 1)"},
    {"min-nodes", "", true, cli::IntField<O>("min-nodes", &O::min_nodes, 1, 100000),
     "elastic: carry on with at least this many nodes when others are lost, the first "
     "(rendezvous) node included (default: all --nodes)"},
    {"gpus-per-node", "", true, cli::IntField<O>("gpus-per-node", &O::gpus_per_node, 0, 64),
     "GPUs per node (default 0: CPU workers)"},
    {"nproc-per-node", "", true, cli::IntField<O>("nproc-per-node", &O::nproc_per_node, 1, 1024),
     "workers per node (default: one per GPU, 1 without GPUs)"},
    {"cpus-per-task", "", true, cli::IntField<O>("cpus-per-task", &O::cpus_per_task, 1, 100000),
     "CPUs for each node's agent and its workers (default 8 per GPU; 1 per worker on CPU)"},
    {"time", "t", true, SetTime, "time limit (default 01:00:00)"},
    {"job-name", "J", true, WordField<O>("job-name", &O::job_name), "job name (default dlrun)"},
    {"partition", "p", true, WordField<O>("partition", &O::partition), "partition (sbatch -p)"},
    {"account", "A", true, WordField<O>("account", &O::account), "account (sbatch -A)"},
    {"constraint", "C", true, WordField<O>("constraint", &O::constraint), "node features (sbatch -C)"},
    {"qos", "", true, WordField<O>("qos", &O::qos), "quality of service"},
    {"exclude", "x", true, WordField<O>("exclude", &O::exclude),
     "hosts to keep the job off (sbatch -x); the nodes of `dlrun bad-nodes` are added"},
    {"mem", "", true, WordField<O>("mem", &O::mem), "memory per node, e.g. 64G"},
    {"output", "", true, WordField<O>("output", &O::output), "output file pattern (default dlrun-%j.out)"},
    {"sbatch-option", "", true, AddSbatchOption, "one more #SBATCH line, e.g. --mail-type=END (repeatable)"},
    {"preemptible", "", false, cli::BoolField<O>(&O::preemptible),
     "SIGUSR1 before the end -> checkpoint, requeue, resume (--signal, --requeue)"},
    {"signal-seconds", "", true, cli::IntField<O>("signal-seconds", &O::signal_seconds, 1, 65535),
     "with --preemptible: seconds of warning before the end (default 90)"},
    {"rdzv-port", "", true, cli::IntField<O>("rdzv-port", &O::rdzv_port, 1, 65535),
     "rendezvous port on the first node (default: 20000 + job id % 10000)"},
    {"tls", "", false, cli::BoolField<O>(&O::tls),
     "mutual TLS for the rendezvous: the script makes a CA and a certificate for this job "
     "(openssl) and removes them when it ends"},
    {"tls-dir", "", true, SetTlsDir,
     "with --tls: a directory every node can read (default $HOME/.dlrun/tls)"},
    {"max-restarts", "", true, cli::IntField<O>("max-restarts", &O::max_restarts, 0, 1000000),
     absl::StrCat("worker-group restarts before the job fails (default ",
                  defaults::kJobMaxRestarts, ")")},
    {"hang-timeout", "", true, cli::DurationField<O>("hang-timeout", &O::hang_timeout, true), "restart workers silent for this many seconds (default off)"},
    {"log-dir", "", true, WordField<O>("log-dir", &O::log_dir), "per-rank log directory"},
    {"profile", "", true, Checked(&O::profile, [](const std::string& v) { return ParseProfileTool(v).status(); }),
     "profile the --profile-ranks with nsys, py-spy, perf or torch (docs/PROFILING.md)"},
    {"profile-ranks", "", true,
     Checked(&O::profile_ranks, [](const std::string& v) { return ParseRankList("profile-ranks", v).status(); }),
     "the global ranks to profile, e.g. 1 or 0,4-5"},
    {"profile-steps", "", true, Checked(&O::profile_steps, [](const std::string& v) { return ParseStepRange(v).status(); }),
     "A:B: capture only steps A to B"},
    {"profile-args", "", true, Checked(&O::profile_args, [](const std::string& v) { return SplitProfileArgs(v).status(); }),
     "more arguments for the profiler"},
    {"metrics-port", "", true, cli::IntField<O>("metrics-port", &O::metrics_port, 1, 65535),
     "serve the job's live page, /metrics (Prometheus) and /api/job on this port of the first "
     "node; the job's output says where to point a browser"},
    {"container-image", "", true, SetContainerImage,
     "run each node's agent in this image with pyxis (srun --container-image)"},
    {"container-mounts", "", true, WordField<O>("container-mounts", &O::container_mounts),
     "SRC:DST[,...] for --container-image (pyxis) or --apptainer (--bind)"},
    {"container-workdir", "", true, WordField<O>("container-workdir", &O::container_workdir),
     "working directory in the --container-image container"},
    {"container", "", true, WordField<O>("container", &O::container_bundle),
     "run each node's agent in this OCI bundle, Slurm's own containers (srun --container)"},
    {"apptainer", "", true, WordField<O>("apptainer", &O::apptainer_image),
     "run each node's agent in this Apptainer image (apptainer exec --nv IMAGE.sif)"},
    {"dlrun", "", true, WordField<O>("dlrun", &O::dlrun_path),
     "path of dlrun on the nodes (in a container: /opt/dlrun/bin/dlrun)"},
    {"output-script", "o", true, cli::StrField<O>(&O::script_path),
     "write the script here (-o; default: stdout)"},
    {"submit", "", false, cli::BoolField<O>(&O::submit), "submit with sbatch and print the job id"},
};

// At most one kind of container, its own options only with it, and dlrun where the image of
// containers/Containerfile has it unless --dlrun says otherwise.
template <class Given>
absl::Status CheckContainer(const Given& given, SlurmJobOptions* o) {
  const int kinds = !o->container_image.empty() + !o->container_bundle.empty() +
                    !o->apptainer_image.empty();
  if (kinds > 1) {
    return absl::InvalidArgumentError(
        "--container-image (pyxis), --container (an OCI bundle) and --apptainer exclude each "
        "other: give one");
  }
  if (!o->container_mounts.empty() && o->container_image.empty() && o->apptainer_image.empty()) {
    return absl::InvalidArgumentError(
        o->container_bundle.empty()
            ? "--container-mounts needs --container-image or --apptainer"
            : "--container-mounts does not apply to --container: an OCI bundle's mounts are in "
              "its config.json (scripts/make-oci-bundle --mount)");
  }
  if (!o->container_workdir.empty() && o->container_image.empty()) {
    return absl::InvalidArgumentError("--container-workdir needs --container-image (pyxis)");
  }
  if (!o->container_bundle.empty() && o->container_bundle.front() != '/') {
    return cli::BadValue("container", o->container_bundle,
                         "the absolute path of an OCI bundle directory every node sees");
  }
  if (kinds == 1 && given.count("dlrun") == 0) o->dlrun_path = "/opt/dlrun/bin/dlrun";
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> ContainerWarnings(const SlurmJobOptions& o) {
  std::vector<std::string> out;
  if (o.container_image.empty()) return out;
  // "nvcr.io#team/dlrun:0.21" -> "dlrun": the last path part, without its tag.
  std::string name = o.container_image.substr(o.container_image.find_last_of("/#") + 1);
  name = name.substr(0, name.find_first_of(":@"));
  const bool mounted = absl::StrContains(o.container_mounts, ":/opt/dlrun");
  if (o.dlrun_path == "/opt/dlrun/bin/dlrun" && !mounted &&
      !absl::StrContains(name, "dlrun")) {
    out.push_back(absl::StrCat(
        "the agent runs /opt/dlrun/bin/dlrun in ", o.container_image,
        ", which only dlrun's own image has (scripts/build-image); for another image give "
        "--dlrun with dlrun's path in it, or mount an installed dlrun there "
        "(--container-mounts=PREFIX:/opt/dlrun, PREFIX holding bin/dlrun)"));
  }
  if (o.container_workdir.empty()) {
    for (const std::string& a : o.command) {
      if (absl::EndsWith(a, ".py") && a.front() != '/') {
        out.push_back(absl::StrCat(
            "the script '", a, "' is a relative path, and pyxis starts in the image's working "
            "directory, not in this one: give --container-workdir (with --container-mounts for "
            "the directory), or the script's absolute path in the image"));
        break;
      }
    }
  }
  return out;
}

absl::StatusOr<SlurmJobOptions> ParseSlurmArgs(const std::vector<std::string>& args) {
  SlurmJobOptions o;
  auto parsed = cli::ParseCommand(cli::ParseSpec{"dlrun slurm"}, kSlurmFlags, args, o);
  if (!parsed.ok()) return parsed.status();
  if (o.help || o.version) return o;
  if (o.min_nodes > o.nodes) {
    return cli::BadValue("min-nodes", absl::StrCat(o.min_nodes),
                         absl::StrCat("at most --nodes (", o.nodes, ")"));
  }
  if (o.min_nodes == o.nodes) o.min_nodes = 0;  // not elastic
  if (!o.profile.empty() && o.profile_ranks.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile ", o.profile, " needs --profile-ranks (e.g. 0 or 0,3)"));
  }
  if (o.profile.empty() && !(o.profile_ranks + o.profile_steps + o.profile_args).empty()) {
    return absl::InvalidArgumentError(
        "--profile-ranks, --profile-steps and --profile-args need --profile");
  }
  if (absl::Status s = CheckContainer(*parsed, &o); !s.ok()) return s;
  if (o.nproc_per_node == 0) o.nproc_per_node = std::max(1, o.gpus_per_node);
  if (o.cpus_per_task == 0) {
    o.cpus_per_task = o.gpus_per_node > 0 ? 8 * o.gpus_per_node : o.nproc_per_node;
  }
  if (o.cpus_per_task < o.nproc_per_node) {
    return cli::BadValue("cpus-per-task", absl::StrCat(o.cpus_per_task),
                    absl::StrCat("at least one CPU per worker (--nproc-per-node ",
                                 o.nproc_per_node, ")"));
  }
  o.args = args;
  return o;
}

std::string SlurmUsage() {
  return cli::Usage(
      "usage: dlrun slurm [options] -- PROGRAM [ARGS...]\n"
      "Writes an sbatch script that runs `srun dlrun ... PROGRAM ARGS` with one agent per node\n"
      "and the rendezvous on the first node; --submit also submits it.\n\noptions:\n",
      kSlurmFlags);
}

namespace {

std::vector<cli::Flag<RunaiJobOptions>> RunaiFlags() {
  using O = RunaiJobOptions;
  auto env = [](O& o, const std::string& v) {
    const auto eq = v.find('=');
    bool ok = eq != std::string::npos && eq > 0;
    for (size_t i = 0; ok && i < eq; ++i) {
      ok = absl::ascii_isalnum(v[i]) || v[i] == '_';
    }
    if (!ok || v.find('\n') != std::string::npos) return cli::BadValue("env", v, "KEY=VALUE");
    o.env.push_back(v);
    return absl::OkStatus();
  };
  auto quantity = [](const std::string& flag, std::string O::*field) {
    return [=](O& o, const std::string& v) {
      bool ok = !v.empty() && absl::ascii_isdigit(v.front());
      for (char c : v) ok = ok && (absl::ascii_isalnum(c) || c == '.');
      if (!ok) return cli::BadValue(flag, v, "a Kubernetes quantity such as 8, 500m or 64Gi");
      o.*field = v;
      return absl::OkStatus();
    };
  };
  auto dns = [](const std::string& flag, std::string O::*field) {
    return [=](O& o, const std::string& v) {
      // Kubernetes object names: lowercase letters, digits and '-', at most 63, alnum at ends.
      bool ok = !v.empty() && v.size() <= 63 && absl::ascii_isalnum(v.front()) &&
                absl::ascii_isalnum(v.back());
      for (char c : v) ok = ok && ((c >= 'a' && c <= 'z') || absl::ascii_isdigit(c) || c == '-');
      if (!ok) {
        return cli::BadValue(flag, v, "a lowercase name of letters, digits and '-' (at most 63)");
      }
      o.*field = v;
      return absl::OkStatus();
    };
  };
  return {
      {"name", "", true, dns("name", &O::name), "workload name (required)"},
      {"project", "p", true, dns("project", &O::project), "Run:ai project (-p)"},
      {"image", "i", true, WordField<O>("image", &O::image),
       "container image with dlrun (required): scripts/build-image makes one from "
       "containers/Containerfile (pip install dlrun into any image also will do)"},
      {"workers", "", true, cli::IntField<O>("workers", &O::workers, 0, 100000),
       "worker pods besides the master pod (default 1: 2 nodes)"},
      {"gpus", "g", true, cli::IntField<O>("gpus", &O::gpus, 0, 64), "GPUs per pod (-g; default 0)"},
      {"nproc-per-node", "", true, cli::IntField<O>("nproc-per-node", &O::nproc_per_node, 1, 1024),
       "workers per pod (default: one per GPU, 1 without GPUs)"},
      {"cpu", "", true, quantity("cpu", &O::cpu), "CPU request per pod"},
      {"memory", "", true, quantity("memory", &O::memory), "memory request per pod"},
      {"rdzv-port", "", true, cli::IntField<O>("rdzv-port", &O::rdzv_port, 1, 65535),
       absl::StrCat("rendezvous port on the master pod (default ", defaults::kRdzvPort, ")")},
      {"max-restarts", "", true, cli::IntField<O>("max-restarts", &O::max_restarts, 0, 1000000),
       absl::StrCat("worker-group restarts before the job fails (default ",
                    defaults::kJobMaxRestarts, ")")},
      {"large-shm", "", false, cli::BoolField<O>(&O::large_shm), "a large /dev/shm (data loaders)"},
      {"legacy-cli", "", false, cli::BoolField<O>(&O::legacy_cli), "print `runai submit-dist pytorch`"},
      {"env", "e", true, env, "KEY=VALUE for every pod (-e; repeatable)"},
      {"dlrun", "", true, WordField<O>("dlrun", &O::dlrun_path), "path of dlrun in the image"},
      {"o", "", true, cli::StrField<O>(&O::manifest_path), "also write a PyTorchJob manifest here"},
  };
}

}  // namespace

absl::StatusOr<RunaiJobOptions> ParseRunaiArgs(const std::vector<std::string>& args) {
  RunaiJobOptions o;
  auto parsed = cli::ParseCommand(cli::ParseSpec{"dlrun runai"}, RunaiFlags(), args, o);
  if (!parsed.ok()) return parsed.status();
  if (o.help || o.version) return o;
  if (o.name.empty()) return absl::InvalidArgumentError("dlrun runai: --name NAME is required");
  if (o.image.empty()) {
    return absl::InvalidArgumentError(
        "dlrun runai: --image IMAGE is required: an image with dlrun, e.g. scripts/build-image's "
        "(containers/Containerfile), pushed to a registry the cluster reads, or yours with "
        "`pip install dlrun` in it");
  }
  if (o.nproc_per_node == 0) o.nproc_per_node = std::max(1, o.gpus);
  if (o.gpus > 0 && o.cpu.empty()) {
    o.cpu = absl::StrCat(kRunaiCpusPerGpu * o.gpus);
  } else if (o.gpus > 0) {
    // A Kubernetes CPU quantity: "12", "12.5" or "12500m".
    double cpus = 0;
    const bool milli = absl::EndsWith(o.cpu, "m");
    if (absl::SimpleAtod(milli ? o.cpu.substr(0, o.cpu.size() - 1) : o.cpu, &cpus)) {
      if (milli) cpus /= 1000;
      const double per_gpu = cpus / o.gpus;
      if (per_gpu < kRunaiCpusPerGpu || per_gpu > kRunaiMaxCpusPerGpu) {
        o.warnings.push_back(absl::StrFormat(
            "--cpu %s is %g CPU(s) per GPU for %d GPU(s): expected %d to %d per GPU (fewer "
            "starve the data loaders, more sit idle)",
            o.cpu, per_gpu, o.gpus, kRunaiCpusPerGpu, kRunaiMaxCpusPerGpu));
      }
    }
  }
  return o;
}

std::string RunaiUsage() {
  return cli::Usage(
      "usage: dlrun runai [options] -- PROGRAM [ARGS...]\n"
      "Prints the Run:ai command that runs PROGRAM under dlrun in a master pod plus --workers\n"
      "worker pods (one dlrun agent per pod); -o FILE also writes the equivalent manifest.\n\n"
      "options:\n",
      RunaiFlags());
}

}  // namespace dlrun::launcher
