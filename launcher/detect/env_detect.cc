#include "launcher/detect/env_detect.h"

#include <functional>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/contract.h"
#include "common/defaults.h"
#include "common/host_port.h"
#include "launcher/detect/findings.h"
#include "launcher/detect/net.h"

namespace dlrun::launcher {
namespace {

// Sets `o.*field` to `value` unless the user gave `flag`, noting what was filled in.
template <typename T>
void Fill(LaunchOptions* o, Detection* d, const std::string& flag, T LaunchOptions::*field,
          const std::optional<T>& value) {
  if (!value || o->given.count(flag)) return;
  o->*field = *value;
  if constexpr (std::is_same_v<T, std::string>) {
    d->applied.emplace_back(flag, *value);
  } else if constexpr (std::is_same_v<T, RdzvBackend>) {
    d->applied.emplace_back(flag, RdzvBackendName(*value));
  } else {
    d->applied.emplace_back(flag, absl::StrCat(*value));
  }
}

// The findings of the environment dlrun runs under, into the options: the command line wins.
Detection Merge(Findings f, Detection d) {
  LaunchOptions* o = &d.options;
  d.source = std::move(f.source);
  d.reason = std::move(f.reason);
  d.evidence = std::move(f.evidence);
  d.slurm_node_id = f.node_order;
  d.expected_hosts = std::move(f.expected_hosts);
  Fill(o, &d, "rdzv-id", &LaunchOptions::rdzv_id, f.rdzv_id);
  if (!f.standalone.empty()) {
    o->standalone = true;
    d.applied.emplace_back("standalone", f.standalone);
    return d;
  }
  if (f.nodes && !o->given.count("nnodes")) {
    o->min_nodes = o->max_nodes = *f.nodes;
    d.applied.emplace_back("nnodes", absl::StrCat(*f.nodes));
  }
  Fill(o, &d, "node-rank", &LaunchOptions::node_rank, f.node_rank);
  Fill(o, &d, "rdzv-backend", &LaunchOptions::rdzv_backend, f.rdzv_backend);
  Fill(o, &d, "rdzv-endpoint", &LaunchOptions::rdzv_endpoint, f.rdzv_endpoint);
  Fill(o, &d, "master-addr", &LaunchOptions::master_addr, f.master_addr);
  Fill(o, &d, "master-port", &LaunchOptions::master_port, f.master_port);
  if (f.master_port) o->master_port_given = true;
  return d;
}

}  // namespace

absl::StatusOr<Detection> DetectEnvironment(const EnvLookup& env, const LaunchOptions& given,
                                            const PmixQuery& pmix) {
  Detection d;
  d.options = given;
  LaunchOptions* o = &d.options;
  if (o->standalone) {
    d.source = "standalone";
    d.reason = "--standalone was given";
    return d;
  }
  GivenFlags g;
  g.rdzv_endpoint = o->given.count("rdzv-endpoint") > 0;
  g.master_addr = o->given.count("master-addr") > 0;
  g.node_rank = o->given.count("node-rank") > 0;
  g.placement = g.rdzv_endpoint || g.master_addr || g.node_rank;
  g.nnodes = o->given.count("nnodes") > 0;
  g.rdzv_asked = o->given.count("rdzv-backend") > 0 && o->rdzv_backend != RdzvBackend::kStatic;
  // In this order: srun --mpi=pmix sets PMIx variables too, and Slurm's say more.
  for (const auto& detect : std::vector<std::function<absl::StatusOr<std::optional<Findings>>()>>{
           [&] { return DetectSlurm(env, g); }, [&] { return DetectOpenMpi(env, g); },
           [&] { return DetectPmix(env, g, pmix); }, [&] { return DetectPod(env, g); },
           [&] { return DetectTorchrunEnv(env, g); }}) {
    auto found = detect();
    if (!found.ok()) return found.status();
    if (found->has_value()) return Merge(**std::move(found), std::move(d));
  }
  if (o->max_nodes == 1 && !g.placement && !o->given.count("master-port") &&
      o->rdzv_backend == RdzvBackend::kStatic) {
    d.source = "standalone";
    d.reason = "no cluster environment and a single node: local rendezvous on a free port";
    o->standalone = true;
    return d;
  }
  d.source = "flags";
  d.reason = "no cluster environment found: the command-line flags decide";
  return d;
}

absl::Status CheckStaticEndpoint(const LaunchOptions& o) {
  if (o.standalone || o.rdzv_backend != RdzvBackend::kStatic || o.rdzv_endpoint.empty()) {
    return absl::OkStatus();
  }
  if (!IsHostPort(o.rdzv_endpoint) || o.rdzv_endpoint.find(',') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid value '", o.rdzv_endpoint,
        "' for --rdzv-endpoint: expected node 0's HOST[:PORT] with a port 0-65535 (the static "
        "rendezvous, where the workers' store listens; a list of endpoints needs --rdzv-backend "
        "c10d)"));
  }
  return absl::OkStatus();
}

std::pair<std::string, int> StaticMaster(const LaunchOptions& o) {
  std::string addr = o.master_addr;
  int port = o.master_port;
  if (!o.standalone && !o.rdzv_endpoint.empty()) {  // torchrun's static backend: HOST[:PORT]
    const HostPort hp = SplitHostPort(o.rdzv_endpoint);
    int p = 0;
    if (hp.has_port && absl::SimpleAtoi(hp.port, &p)) {
      addr = hp.host;
      port = p;
    } else {
      addr = o.rdzv_endpoint;
    }
    addr = Unbracketed(addr);
  }
  return {addr, port};
}

std::string FormatDetection(const Detection& d) {
  const LaunchOptions& o = d.options;
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
  absl::StrAppend(&s, absl::StrFormat("  %-16s %s\n", "nproc-per-node", o.nproc_per_node.text));
  absl::StrAppend(&s,
                  absl::StrFormat("  %-16s %s\n", "rendezvous",
                                  o.standalone ? "standalone (local, free port)"
                                  : o.rdzv_backend == RdzvBackend::kStatic
                                      ? absl::StrCat("static: node rank ", o.node_rank, ", master ",
                                                     JoinHostPort(master.first, master.second))
                                      : absl::StrCat("grpc at ", o.rdzv_endpoint)));
  absl::StrAppend(&s, absl::StrFormat("  %-16s %s\n", "run id", o.rdzv_id));
  return s;
}

}  // namespace dlrun::launcher
