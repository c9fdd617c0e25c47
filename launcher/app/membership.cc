// The membership a launch asks for (membership.h).
#include "launcher/app/membership.h"

#include "absl/strings/str_cat.h"
#include "common/local_address.h"
#include "launcher/detect/net.h"
#include "launcher/rdzv/failover.h"
#include "launcher/cli/job_token.h"
#include "launcher/rdzv/rdzv_loader.h"
#include "launcher/rdzv/rdzv_source.h"
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

absl::StatusOr<std::unique_ptr<MembershipSource>> RendezvousSource(const LaunchOptions& o,
                                                                   const Detection& d,
                                                                   const Machine& m, int nproc,
                                                                   const EnvLookup& env) {
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
    const std::string ep = absl::StrCat(h, ":", rdzv_port);
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
  r.nproc = nproc;
  r.slurm_node_id = d.slurm_node_id;
  r.role = o.role;
  r.config.expected_hosts = d.expected_hosts;
  r.config.min_nodes = o.min_nodes;
  r.config.max_nodes = o.max_nodes;
  r.config.max_restarts = o.max_restarts;
  r.telemetry = TelemetryOptionsFrom(o);
  o.rdzv_conf.ApplyTo(&r.config);
  r.is_host = o.rdzv_conf.is_host;
  return MakeRendezvousSource(std::move(r));
}

// The gRPC rendezvous, or a static one.
absl::StatusOr<std::unique_ptr<MembershipSource>> MakeSource(const LaunchOptions& o,
                                                             const Detection& d, const Machine& m,
                                                             const LaunchPlan& plan,
                                                             const EnvLookup& env) {
  const bool use_rdzv = !o.standalone && o.rdzv_backend != RdzvBackend::kStatic;
  if (!use_rdzv && !o.standalone && o.min_nodes != o.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid value '", o.min_nodes, ":", o.max_nodes,
        "' for --nnodes: the static rendezvous needs a fixed node count N (use --rdzv-backend "
        "c10d for elastic MIN:MAX)"));
  }
  if (use_rdzv) return RendezvousSource(o, d, m, plan.nproc, env);
  // The static backend, as torchrun, takes the store's address from --rdzv-endpoint when given
  // (--rdzv-conf was checked with the other flags; its keys set no timeouts here).
  Assignment base = StaticAssignment(o, plan.nproc);
  std::function<int()> pick;
  if (o.standalone) {
    base.master_addr = "127.0.0.1";
    base.run_id = plan.run_id;
    if (!o.master_port_given) {
      // A fresh port per attempt, held (bound, not listening) while that attempt runs.
      auto held = std::make_shared<PortReservation>();
      pick = [held] {
        *held = ReservePort("127.0.0.1");
        return held->port();
      };
    }
  }
  return MakeStaticSource(base, o.max_restarts, pick, TelemetryOptionsFrom(o));
}

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

absl::StatusOr<Membership> MakeMembership(const LaunchOptions& o, const Detection& d,
                                          const Machine& m, const LaunchPlan& plan,
                                          const EnvLookup& env) {
  auto source = MakeSource(o, d, m, plan, env);
  if (!source.ok()) return source.status();
  return Membership{*std::move(source), MetricsServing(o)};
}

}  // namespace dlrun::launcher
