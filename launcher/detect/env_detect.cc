#include "launcher/detect/env_detect.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/contract.h"
#include "common/defaults.h"
#include "common/scheduler_env.h"
#include "launcher/detect/hostlist.h"
#include "launcher/detect/net.h"

namespace dlrun::launcher {
namespace {

class Reader {
 public:
  Reader(const EnvLookup& env, Detection* d) : env_(env), d_(d) {}
  std::optional<std::string> Get(const std::string& name) {
    auto v = env_(name);
    if (v) d_->evidence.emplace_back(name, *v);
    return v;
  }
  absl::StatusOr<int> Int(const std::string& name, int lo) {
    auto v = Get(name);
    int x = 0;
    if (!v || !absl::SimpleAtoi(*v, &x) || x < lo) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", name, "='", v.value_or(""), "' is invalid: expected an integer >= ", lo));
    }
    return x;
  }

 private:
  const EnvLookup& env_;
  Detection* d_;
};

// Sets `o.*field` to `value` unless the user gave `flag`.
template <typename T>
void Fill(LaunchOptions* o, Detection* d, const std::string& flag, T LaunchOptions::*field,
          const T& value) {
  if (o->given.count(flag)) return;
  o->*field = value;
  if constexpr (std::is_same_v<T, std::string>) {
    d->applied.emplace_back(flag, value);
  } else {
    d->applied.emplace_back(flag, absl::StrCat(value));
  }
}

void FillNodes(LaunchOptions* o, Detection* d, int n) {
  if (o->given.count("nnodes")) return;
  o->min_nodes = o->max_nodes = n;
  d->applied.emplace_back("nnodes", absl::StrCat(n));
}

// MASTER_PORT, when set, fills --master-port (unless given); a bad value is an error.
absl::Status FillMasterPort(Reader& r, LaunchOptions* o, Detection* d) {
  auto port = r.Get(contract::kMasterPort);
  if (!port) return absl::OkStatus();
  int p = 0;
  if (!absl::SimpleAtoi(*port, &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable MASTER_PORT='", *port,
                                                   "' is invalid: expected 1-65535"));
  }
  Fill(o, d, "master-port", &LaunchOptions::master_port, p);
  o->master_port_given = true;
  return absl::OkStatus();
}

// contract::kRdzvPort (the rendezvous port when dlrun derives the endpoint), default 29400.
absl::StatusOr<std::string> RdzvPort(Reader& r) {
  const std::string v = r.Get(contract::kRdzvPort).value_or(std::to_string(defaults::kRdzvPort));
  int p = 0;
  if (!absl::SimpleAtoi(v, &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", contract::kRdzvPort, "='", v,
                                                   "' is invalid: expected 1-65535"));
  }
  return v;
}

}  // namespace

absl::StatusOr<Detection> DetectEnvironment(const EnvLookup& env, LaunchOptions* o,
                                            const PmixQuery& pmix) {
  Detection d;
  Reader r(env, &d);
  if (o->standalone) {
    d.source = "standalone";
    d.reason = "--standalone was given";
    return d;
  }
  const bool placement_given = o->given.count("rdzv-endpoint") || o->given.count("master-addr") ||
                               o->given.count("node-rank");

  if (env(sched::kSlurmJobId) && env(sched::kSlurmProcId)) {
    d.source = "slurm";
    d.reason = "inside a Slurm step (SLURM_JOB_ID and SLURM_PROCID are set); one dlrun per node";
    r.Get(sched::kSlurmJobId);
    auto nodes_var = env(sched::kSlurmStepNumNodes) ? sched::kSlurmStepNumNodes : sched::kSlurmJobNumNodes;
    auto nodes = r.Int(nodes_var, 1);
    if (!nodes.ok()) return nodes.status();
    auto nodeid = r.Int(sched::kSlurmNodeId, 0);
    if (!nodeid.ok()) return nodeid.status();
    d.slurm_node_id = *nodeid;
    if (auto ntasks = env(sched::kSlurmNtasks); ntasks && *ntasks != absl::StrCat(*nodes)) {
      r.Get(sched::kSlurmNtasks);
      d.reason += "; note: SLURM_NTASKS differs from the node count, dlrun wants "
                  "--ntasks-per-node=1";
    }
    Fill(o, &d, "rdzv-id", &LaunchOptions::rdzv_id, *env(sched::kSlurmJobId));
    if (*nodes == 1 && !placement_given) {
      o->standalone = true;
      d.applied.emplace_back("standalone", "true (a one-node step)");
      return d;
    }
    const std::string list_var = env(sched::kSlurmStepNodelist) ? sched::kSlurmStepNodelist
                                                            : sched::kSlurmJobNodelist;
    auto list = r.Get(list_var);
    if (!list) {
      return absl::FailedPreconditionError(
          "inside Slurm but SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset");
    }
    auto hosts = ExpandHostlist(*list);
    if (!hosts.ok()) return hosts.status();
    d.expected_hosts = *hosts;
    FillNodes(o, &d, *nodes);
    Fill(o, &d, "rdzv-backend", &LaunchOptions::rdzv_backend, std::string("grpc"));
    auto port = RdzvPort(r);
    if (!port.ok()) return port.status();
    Fill(o, &d, "rdzv-endpoint", &LaunchOptions::rdzv_endpoint, absl::StrCat((*hosts)[0], ":", *port));
    return d;
  }

  if (env(sched::kOmpiWorldSize)) {
    d.source = "openmpi";
    d.reason = "started by Open MPI's mpirun (OMPI_COMM_WORLD_* are set); one dlrun per node";
    auto size = r.Int(sched::kOmpiWorldSize, 1);
    if (!size.ok()) return size.status();
    auto rank = r.Int(sched::kOmpiWorldRank, 0);
    if (!rank.ok()) return rank.status();
    auto local_size = r.Int(sched::kOmpiLocalSize, 1);
    if (!local_size.ok()) return local_size.status();
    auto addr = r.Get(contract::kMasterAddr);
    if (!addr && *local_size != *size && !o->given.count("master-addr")) {
      return absl::FailedPreconditionError(
          "under mpirun across nodes dlrun needs the address of rank 0: export MASTER_ADDR "
          "(mpirun -x MASTER_ADDR=host) or pass --master-addr");
    }
    FillNodes(o, &d, *size);
    Fill(o, &d, "node-rank", &LaunchOptions::node_rank, *rank);
    Fill(o, &d, "rdzv-backend", &LaunchOptions::rdzv_backend, std::string("static"));
    Fill(o, &d, "master-addr", &LaunchOptions::master_addr, addr.value_or("127.0.0.1"));
    if (absl::Status s = FillMasterPort(r, o, &d); !s.ok()) return s;
    if (auto job = r.Get("OMPI_MCA_orte_ess_jobid")) {
      Fill(o, &d, "rdzv-id", &LaunchOptions::rdzv_id, *job);
    }
    return d;
  }

  if (env(sched::kPmixNamespace) && env(sched::kPmixRank)) {
    d.source = "pmix";
    d.reason = "started by a PMIx launcher (PMIX_NAMESPACE and PMIX_RANK are set, no Slurm or "
               "Open MPI variables): the job's layout comes from PMIx_Get; one dlrun per node";
    r.Get(sched::kPmixNamespace);
    r.Get(sched::kPmixRank);
    auto job = pmix();
    if (!job.ok()) return job.status();
    const auto show = [&](const char* key, const std::optional<uint32_t>& v) {
      d.evidence.emplace_back(absl::StrCat("PMIx ", key), v ? absl::StrCat(*v) : "(none)");
    };
    d.evidence.emplace_back("PMIx namespace", job->nspace);
    d.evidence.emplace_back("PMIx rank", absl::StrCat(job->rank));
    show(sched::kPmixJobSize, job->job_size);
    show(sched::kPmixNumNodes, job->num_nodes);
    show(sched::kPmixLocalSize, job->local_size);
    d.evidence.emplace_back("PMIx PMIX_NODE_LIST", job->node_list.empty() ? "(none)" : job->node_list);
    d.evidence.emplace_back("PMIx PMIX_HOSTNAME (rank 0)",
                            job->rank0_host.empty() ? "(none)" : job->rank0_host);
    if (!job->job_size || *job->job_size < 1 || job->rank >= *job->job_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the PMIx server of namespace '", job->nspace, "' gave no valid PMIX_JOB_SIZE (rank ",
          job->rank, "): pass --nnodes, --node-rank and the rendezvous flags"));
    }
    const int nodes = static_cast<int>(*job->job_size);
    if (job->local_size && *job->local_size > 1) {
      d.reason += absl::StrCat("; note: ", *job->local_size,
                               " processes of the job share this node, dlrun wants one per node");
    }
    d.slurm_node_id = static_cast<int>(job->rank);  // agents line up in PMIx rank order
    Fill(o, &d, "rdzv-id", &LaunchOptions::rdzv_id, job->nspace);
    if (nodes == 1 && !placement_given) {
      o->standalone = true;
      d.applied.emplace_back("standalone", "true (a one-process PMIx job)");
      return d;
    }
    std::vector<std::string> hosts;
    if (!job->node_list.empty()) hosts = absl::StrSplit(job->node_list, ',', absl::SkipEmpty());
    std::string host0 = !job->rank0_host.empty() ? job->rank0_host : hosts.empty() ? "" : hosts[0];
    if (host0.empty() && !o->given.count("rdzv-endpoint")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the PMIx server of namespace '", job->nspace,
          "' knows neither PMIX_HOSTNAME of rank 0 nor PMIX_NODE_LIST: pass --rdzv-endpoint "
          "HOST:PORT of the node of PMIx rank 0"));
    }
    d.expected_hosts = hosts;
    FillNodes(o, &d, nodes);
    Fill(o, &d, "rdzv-backend", &LaunchOptions::rdzv_backend, std::string("grpc"));
    auto port = RdzvPort(r);
    if (!port.ok()) return port.status();
    if (!host0.empty()) {
      Fill(o, &d, "rdzv-endpoint", &LaunchOptions::rdzv_endpoint, absl::StrCat(host0, ":", *port));
    }
    return d;
  }

  const bool kubeflow = env(sched::kPetNnodes) || env(sched::kPetNodeRank) || env(sched::kPetRdzvEndpoint) ||
                        (env(contract::kMasterAddr) && env("RANK") && env("WORLD_SIZE") &&
                         !env("LOCAL_RANK") && env(sched::kPodIndex));
  if (kubeflow) {
    d.source = "kubeflow";
    d.reason = "in a Kubeflow PyTorchJob / Run:ai pod (PET_* or MASTER_ADDR + RANK as the pod "
               "index are set); one dlrun per pod";
    for (const char* v : {sched::kPetNnodes, sched::kPetNodeRank, sched::kPetNprocPerNode, sched::kPetRdzvEndpoint,
                          "JOB_NAME", sched::kJobUuid, sched::kPodIndex}) {
      r.Get(v);
    }
    // The pod's index orders the agents at the rendezvous (master pod first), like SLURM_NODEID.
    for (const char* v : {sched::kPodIndex, sched::kPetNodeRank, "RANK"}) {
      int idx = 0;
      if (auto val = env(v); val && absl::SimpleAtoi(*val, &idx) && idx >= 0) {
        d.slurm_node_id = idx;
        break;
      }
    }
    const bool rdzv_asked = o->given.count("rdzv-backend") && o->rdzv_backend != "static";
    if (env(sched::kPetRdzvEndpoint)) {
      // --rdzv-endpoint itself comes from PET_RDZV_ENDPOINT through the flag table.
      Fill(o, &d, "rdzv-backend", &LaunchOptions::rdzv_backend, std::string("grpc"));
    } else if (rdzv_asked && !o->given.count("rdzv-endpoint")) {
      // `dlrun runai` pods: --rdzv-backend grpc and the master pod hosts the rendezvous.
      auto addr = r.Get(contract::kMasterAddr);
      if (!addr) {
        return absl::FailedPreconditionError(
            "in a pod with --rdzv-backend grpc but MASTER_ADDR is unset: pass --rdzv-endpoint "
            "HOST:PORT of the pod that hosts the rendezvous");
      }
      auto port = RdzvPort(r);
      if (!port.ok()) return port.status();
      Fill(o, &d, "rdzv-endpoint", &LaunchOptions::rdzv_endpoint, absl::StrCat(*addr, ":", *port));
    } else if (!rdzv_asked) {
      // The operator's RANK is the pod index (master 0, worker i -> i+1), not a process rank.
      auto rank_var = env(sched::kPetNodeRank) ? sched::kPetNodeRank : "RANK";
      auto rank = r.Int(rank_var, 0);
      if (!rank.ok()) return rank.status();
      Fill(o, &d, "node-rank", &LaunchOptions::node_rank, *rank);
      if (!o->given.count("nnodes")) {
        // WORLD_SIZE is replicas in older operators and replicas x nproc in newer ones.
        auto ws = r.Int("WORLD_SIZE", 1);
        if (!ws.ok()) return ws.status();
        FillNodes(o, &d, *ws);
      }
      Fill(o, &d, "rdzv-backend", &LaunchOptions::rdzv_backend, std::string("static"));
      if (auto addr = r.Get(contract::kMasterAddr)) {
        Fill(o, &d, "master-addr", &LaunchOptions::master_addr, *addr);
      }
      if (absl::Status s = FillMasterPort(r, o, &d); !s.ok()) return s;
    }
    if (auto id = env(sched::kJobUuid)) Fill(o, &d, "rdzv-id", &LaunchOptions::rdzv_id, *id);
    return d;
  }

  if (env(contract::kMasterAddr) && (env("NODE_RANK") || env("GROUP_RANK")) && env("NNODES")) {
    d.source = "torchrun-env";
    d.reason = "MASTER_ADDR, NODE_RANK and NNODES are set (a torchrun-style static setup)";
    auto nn = r.Int("NNODES", 1);
    if (!nn.ok()) return nn.status();
    auto nr = r.Int(env("NODE_RANK") ? "NODE_RANK" : "GROUP_RANK", 0);
    if (!nr.ok()) return nr.status();
    FillNodes(o, &d, *nn);
    Fill(o, &d, "node-rank", &LaunchOptions::node_rank, *nr);
    Fill(o, &d, "master-addr", &LaunchOptions::master_addr, *r.Get(contract::kMasterAddr));
    if (absl::Status s = FillMasterPort(r, o, &d); !s.ok()) return s;
    return d;
  }

  if (o->max_nodes == 1 && !placement_given && !o->given.count("master-port") &&
      o->rdzv_backend == "static") {
    d.source = "standalone";
    d.reason = "no cluster environment and a single node: local rendezvous on a free port";
    o->standalone = true;
    return d;
  }
  d.source = "flags";
  d.reason = "no cluster environment found: the command-line flags decide";
  return d;
}

std::pair<std::string, int> StaticMaster(const LaunchOptions& o) {
  std::string addr = o.master_addr;
  int port = o.master_port;
  if (!o.standalone && !o.rdzv_endpoint.empty()) {  // torchrun's static backend: HOST[:PORT]
    const size_t colon = o.rdzv_endpoint.rfind(':');
    int p = 0;
    if (colon != std::string::npos && o.rdzv_endpoint.find(']', colon) == std::string::npos &&
        absl::SimpleAtoi(o.rdzv_endpoint.substr(colon + 1), &p)) {
      addr = o.rdzv_endpoint.substr(0, colon);
      port = p;
    } else {
      addr = o.rdzv_endpoint;
    }
    addr = Unbracketed(addr);
  }
  return {addr, port};
}

std::string FormatDetection(const Detection& d, const LaunchOptions& o) {
  std::string s = absl::StrCat("detected   ", d.source, "\nwhy        ", d.reason, "\n");
  if (!d.evidence.empty()) {
    absl::StrAppend(&s, "\nvariable                     value\n");
    for (const auto& [k, v] : d.evidence) absl::StrAppend(&s, absl::StrFormat("%-28s %s\n", k, v));
  }
  if (!d.applied.empty()) {
    absl::StrAppend(&s, "\nsetting (from the environment)  value\n");
    for (const auto& [k, v] : d.applied) {
      absl::StrAppend(&s, absl::StrFormat("--%-30s %s\n", k, v));
    }
  }
  absl::StrAppend(&s, "\nresult\n");
  const std::pair<std::string, int> master = StaticMaster(o);
  absl::StrAppend(&s, absl::StrFormat("  %-16s %d:%d\n", "nnodes", o.min_nodes, o.max_nodes));
  absl::StrAppend(&s, absl::StrFormat("  %-16s %s\n", "nproc-per-node", o.nproc_per_node));
  absl::StrAppend(&s, absl::StrFormat("  %-16s %s\n", "rendezvous",
                                      o.standalone ? "standalone (local, free port)"
                                                   : o.rdzv_backend == "static"
                                                         ? absl::StrCat("static: node rank ", o.node_rank, ", master ",
                                                                master.first, ":", master.second)
                                                         : absl::StrCat("grpc at ", o.rdzv_endpoint)));
  absl::StrAppend(&s, absl::StrFormat("  %-16s %s\n", "run id", o.rdzv_id));
  return s;
}

}  // namespace dlrun::launcher
