// The rendezvous backends' registry (backends.h).
#include "launcher/app/backends.h"

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/local_address.h"
#include "launcher/detect/net.h"
#include "launcher/rdzv/failover.h"
#include "launcher/cli/job_token.h"
#include "launcher/rdzv/rdzv_loader.h"
#include "launcher/rdzv/rdzv_source.h"
#include "launcher/rdzv/static_source.h"
#include "rendezvous/tls.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

telemetry::TelemetryOptions TelemetryOptionsFrom(const LaunchOptions& o) {
  telemetry::TelemetryOptions t;
  t.straggler_factor = o.telemetry_flags.straggler_factor;
  t.straggler_windows = o.telemetry_flags.straggler_windows;
  t.on_straggler = [](const std::string& line) { spdlog::warn("{}", line); };
  return t;
}

struct BackendInputs {
  const LaunchOptions& o;
  const Detection& d;
  const Machine& m;
  const LaunchPlan& plan;
  const EnvLookup& env;
};

absl::StatusOr<JobLink> GrpcBackend(const BackendInputs& in) {
  const LaunchOptions& o = in.o;
  const Detection& d = in.d;
  const Machine& m = in.m;
  const EnvLookup& env = in.env;
  if (o.rdzv_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv-endpoint is empty: the rendezvous needs HOST[:PORT] (the same on every node)");
  }
  RdzvSourceOptions r;
  auto endpoints = ParseEndpointList(o.rdzv_endpoint);
  if (!endpoints.ok()) return endpoints.status();
  // A host whose name does not resolve would be retried for the whole join timeout, silently:
  // the first entry's host must resolve.
  if (absl::Status s = ResolveHost(SplitEndpoint(endpoints->front()).first); !s.ok()) {
    return absl::NotFoundError(
        absl::StrCat("the rendezvous endpoint ", endpoints->front(), ": ", s.message()));
  }
  r.endpoint = endpoints->front();
  if (endpoints->size() > 1) r.candidates = *endpoints;
  // The other nodes of the job's node list, where a host may already serve this job.
  const std::string rdzv_port = SplitEndpoint(r.endpoint).second;
  for (const std::string& h : d.expected_hosts) {
    if (r.peers.size() >= rdzv::kMaxSuccessors) break;
    const std::string ep = JoinHostPort(h, rdzv_port);
    if (ep != r.endpoint) r.peers.push_back(ep);
  }
  r.run_id = o.rdzv_id;
  auto token = JobToken(env, o.rdzv_id);
  if (!token.ok()) return token.status();
  r.token = *token;
  auto tls = rdzv::TlsConfigFromEnv();
  if (!tls.ok()) return tls.status();
  r.tls = std::move(*tls);
  r.hostname = m.hostname;
  const std::string ep_host = SplitEndpoint(r.endpoint).first;
  r.local_addr = !o.local_addr.empty() ? o.local_addr : LocalAddressFor(ep_host);
  if (r.local_addr.empty()) r.local_addr = r.hostname;
  r.nproc = in.plan.nproc;
  r.slurm_node_id = d.slurm_node_id;
  r.role = o.role;
  r.in_process = o.recovery == "in-process";
  r.config.expected_hosts = d.expected_hosts;
  r.config.min_nodes = o.min_nodes;
  r.config.max_nodes = o.max_nodes;
  r.config.max_restarts = o.max_restarts;
  r.telemetry = TelemetryOptionsFrom(o);
  r.preflight = in.plan.preflight;
  r.bad_nodes_files = in.plan.bad_nodes_files;
  o.rdzv_conf.ApplyTo(&r.config);
  r.is_host = o.rdzv_conf.is_host;
  return MakeRendezvousSource(std::move(r));
}

// The static backend, as torchrun, takes the store's address from --rdzv-endpoint when given
// (--rdzv-conf was checked with the other flags; its keys set no timeouts here).
absl::StatusOr<JobLink> StaticBackend(const BackendInputs& in) {
  const LaunchOptions& o = in.o;
  if (o.min_nodes != o.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid value '", o.min_nodes, ":", o.max_nodes,
        "' for --nnodes: the static rendezvous needs a fixed node count N (use --rdzv-backend "
        "c10d for elastic MIN:MAX)"));
  }
  Assignment base = StaticAssignment(o, in.plan.nproc);
  // The workers would retry an address that does not resolve until their store's timeout (minutes,
  // and again at each restart): said once, before any worker starts.
  if (absl::Status s = ResolveHost(base.master_addr); !s.ok()) {
    const bool endpoint = !o.standalone && !o.rdzv_endpoint.empty();
    return absl::NotFoundError(
        absl::StrCat("the master address (",
                     endpoint ? "--rdzv-endpoint's host" : "--master-addr or MASTER_ADDR",
                     ": node 0's, which every node's workers connect to): ", s.message()));
  }
  return MakeStaticSource(base, o.max_restarts, nullptr, TelemetryOptionsFrom(o));
}

// One node on loopback: a fresh port per attempt unless --master-port was given.
absl::StatusOr<JobLink> StandaloneBackend(const BackendInputs& in) {
  const LaunchOptions& o = in.o;
  Assignment base = StaticAssignment(o, in.plan.nproc);
  base.master_addr = "127.0.0.1";
  base.run_id = in.plan.run_id;
  std::function<int()> pick;
  if (!o.master_port_given) {
    // A fresh port per attempt, held (bound, not listening) while that attempt runs.
    auto held = std::make_shared<PortReservation>();
    pick = [held] {
      *held = ReservePort("127.0.0.1");
      return held->port();
    };
  }
  return MakeStaticSource(base, o.max_restarts, pick, TelemetryOptionsFrom(o));
}

struct Registered {
  const char* name;
  absl::StatusOr<JobLink> (*make)(const BackendInputs&);
};
constexpr Registered kBackends[] = {
    {"grpc", GrpcBackend},
    {"static", StaticBackend},
    {"standalone", StandaloneBackend},
};

// --metrics-port: the job's aggregate over HTTP, served by the rendezvous plugin (as gRPC is).
std::function<std::shared_ptr<void>(std::shared_ptr<telemetry::JobTelemetry>)> MetricsServing(
    const LaunchOptions& o) {
  if (o.telemetry_flags.metrics_port < 0) return nullptr;
  return [port = o.telemetry_flags.metrics_port, addr = o.telemetry_flags.metrics_addr](
             std::shared_ptr<telemetry::JobTelemetry> t) -> std::shared_ptr<void> {
    auto api = LoadRendezvous();
    if (!api.ok()) {
      spdlog::error("--metrics-port: {}", std::string(api.status().message()));
      return nullptr;
    }
    auto m = (*api)->ServeMetrics(std::move(t), addr, port);
    if (!m.ok()) {
      spdlog::error("--metrics-port: {}; the job goes on without it",
                    std::string(m.status().message()));
      return nullptr;
    }
    return std::shared_ptr<telemetry::MetricsServer>(std::move(*m));
  };
}

}  // namespace

absl::StatusOr<Backend> MakeBackend(const LaunchOptions& o, const Detection& d, const Machine& m,
                                    const LaunchPlan& plan, const EnvLookup& env) {
  const std::string name = o.standalone ? "standalone" : RdzvBackendName(o.rdzv_backend);
  for (const Registered& b : kBackends) {
    if (name != b.name) continue;
    auto link = b.make(BackendInputs{o, d, m, plan, env});
    if (!link.ok()) return link.status();
    return Backend{*std::move(link), MetricsServing(o)};
  }
  return absl::InternalError(absl::StrCat("no rendezvous backend '", name, "' is registered"));
}

std::vector<std::string> BackendNames() {
  std::vector<std::string> out;
  for (const Registered& b : kBackends) out.push_back(b.name);
  return out;
}

}  // namespace dlrun::launcher
