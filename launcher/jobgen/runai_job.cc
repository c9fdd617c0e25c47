// `dlrun runai`: the Run:ai submission command and a PyTorchJob manifest.
#include "common/contract.h"
#include "common/defaults.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "launcher/jobgen/job_script.h"
#include "launcher/jobgen/shell.h"

namespace dlrun::launcher {

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
      {"image", "i", true, WordField<O>("image", &O::image), "container image with dlrun (required)"},
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

std::string YamlQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<RunaiJobOptions> ParseRunaiArgs(const std::vector<std::string>& args) {
  RunaiJobOptions o;
  auto parsed = cli::ParseFlags(cli::ParseSpec{"dlrun runai"}, RunaiFlags(), args, o);
  if (!parsed.ok()) return parsed.status();
  o.command = std::move(parsed->program);
  if (o.name.empty()) return absl::InvalidArgumentError("dlrun runai: --name NAME is required");
  if (o.image.empty()) return absl::InvalidArgumentError("dlrun runai: --image IMAGE is required");
  if (o.nproc_per_node == 0) o.nproc_per_node = std::max(1, o.gpus);
  return o;
}

std::vector<std::string> RunaiPodCommand(const RunaiJobOptions& o) {
  // Every pod runs the same agent. The master pod (MASTER_ADDR, set by the operator) hosts the
  // gRPC rendezvous on --rdzv-port; dlrun fills the endpoint in from MASTER_ADDR and orders
  // the pods by POD_INDEX / RANK (see `dlrun env` in a pod).
  std::vector<std::string> cmd = {o.dlrun_path,
                                  "--nnodes", absl::StrCat(o.workers + 1),
                                  "--nproc-per-node", absl::StrCat(o.nproc_per_node),
                                  "--rdzv-backend", "grpc",
                                  "--max-restarts", absl::StrCat(o.max_restarts),
                                  "--"};
  cmd.insert(cmd.end(), o.command.begin(), o.command.end());
  return cmd;
}

std::string RenderRunaiCommand(const RunaiJobOptions& o) {
  std::vector<std::string> w;
  if (o.legacy_cli) {
    w = {"runai", "submit-dist", "pytorch", "--name", o.name};
  } else {
    w = {"runai", "training", "pytorch", "submit", o.name};
  }
  if (!o.project.empty()) w.insert(w.end(), {"-p", o.project});
  w.insert(w.end(), {"-i", o.image});
  w.push_back(absl::StrCat("--workers=", o.workers));
  if (o.gpus > 0) w.insert(w.end(), {"-g", absl::StrCat(o.gpus)});
  if (!o.cpu.empty()) w.insert(w.end(), {"--cpu", o.cpu});
  if (!o.memory.empty()) w.insert(w.end(), {"--memory", o.memory});
  if (o.large_shm) w.push_back("--large-shm");
  w.insert(w.end(), {"-e", absl::StrCat(contract::kRdzvPort, "=", o.rdzv_port)});
  for (const auto& e : o.env) w.insert(w.end(), {"-e", e});
  w.insert(w.end(), {"--command", "--"});
  for (const auto& a : RunaiPodCommand(o)) w.push_back(a);
  return JoinCommand(w) + "\n";
}

std::string RenderRunaiManifest(const RunaiJobOptions& o) {
  // A PyTorchJob with one master and `workers` worker replicas, the shape Run:ai's distributed
  // PyTorch workloads take. The rendezvous token comes from a Secret created alongside.
  const std::string token_secret = absl::StrCat(o.name, "-dlrun-token");
  std::string s = absl::StrCat(
      "# Generated by `dlrun runai`: apply with `kubectl apply -f` (both objects).\n"
      "# Each pod runs one dlrun agent; the master pod hosts the rendezvous on port ",
      o.rdzv_port, ".\n",
      "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ", token_secret,
      "\n", o.project.empty() ? "" : absl::StrCat("  namespace: runai-", o.project, "\n"),
      "type: Opaque\nstringData:\n  token: ", RandomHex(24), "\n---\n",
      "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: ", o.name, "\n",
      o.project.empty() ? "" : absl::StrCat("  namespace: runai-", o.project, "\n"),
      "  labels:\n    project: ", o.project.empty() ? "default" : o.project, "\n",
      "spec:\n  pytorchReplicaSpecs:\n");
  auto replica = [&](const std::string& kind, int replicas) {
    absl::StrAppend(&s, "    ", kind, ":\n      replicas: ", replicas,
                    "\n      restartPolicy: OnFailure\n      template:\n        spec:\n");
    if (!o.project.empty()) absl::StrAppend(&s, "          schedulerName: runai-scheduler\n");
    absl::StrAppend(&s, "          containers:\n          - name: pytorch\n            image: ",
                    YamlQuote(o.image), "\n            command:\n");
    for (const auto& a : RunaiPodCommand(o)) absl::StrAppend(&s, "            - ", YamlQuote(a), "\n");
    absl::StrAppend(&s, "            env:\n            - name: ", contract::kRdzvPort, "\n              value: ",
                    YamlQuote(absl::StrCat(o.rdzv_port)), "\n",
                    "            - name: ", contract::kRdzvToken, "\n              valueFrom:\n"
                    "                secretKeyRef:\n                  name: ", token_secret,
                    "\n                  key: token\n");
    for (const auto& e : o.env) {
      const auto eq = e.find('=');
      absl::StrAppend(&s, "            - name: ", e.substr(0, eq), "\n              value: ",
                      YamlQuote(e.substr(eq + 1)), "\n");
    }
    absl::StrAppend(&s, "            ports:\n            - containerPort: ", o.rdzv_port,
                    "\n              name: dlrun-rdzv\n");
    if (o.gpus > 0 || !o.cpu.empty() || !o.memory.empty()) {
      absl::StrAppend(&s, "            resources:\n              limits:\n");
      if (o.gpus > 0) absl::StrAppend(&s, "                nvidia.com/gpu: ", o.gpus, "\n");
      if (!o.cpu.empty()) absl::StrAppend(&s, "                cpu: ", YamlQuote(o.cpu), "\n");
      if (!o.memory.empty()) absl::StrAppend(&s, "                memory: ", YamlQuote(o.memory), "\n");
    }
    if (o.large_shm) {
      absl::StrAppend(&s, "            volumeMounts:\n            - name: dshm\n              mountPath: /dev/shm\n"
                          "          volumes:\n          - name: dshm\n            emptyDir:\n"
                          "              medium: Memory\n");
    }
  };
  replica("Master", 1);
  if (o.workers > 0) replica("Worker", o.workers);
  return s;
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
