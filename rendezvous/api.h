// The rendezvous as the launcher sees it: no gRPC or protobuf types. The launcher loads the
// implementation (libdlrun_rdzv.so) with dlopen only when it needs it, so `dlrun --standalone`
// does not pay for loading gRPC (about 10 ms of start-up on the development machine).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/defaults.h"
#include "rendezvous/client.h"
#include "telemetry/metrics_http.h"
#include "telemetry/telemetry.h"
#include "rendezvous/types.h"

namespace dlrun::rdzv {

// A rendezvous server running inside this process (the agent of node rank 0 hosts one).
class HostedRendezvous {
 public:
  virtual ~HostedRendezvous() = default;
  virtual int port() const = 0;
  virtual void Shutdown() = 0;
  // Waits until the job has ended and every node has heard it; false if `timeout` passed.
  virtual bool WaitForJobEnd(Duration timeout) = 0;
  // Other endpoints that may host this job (earlier hosts, candidates): asked for their epoch
  // every heartbeat interval, on a thread of the server's own. One that answers with a newer
  // epoch makes this host step down and redirect every caller there (docs/FAILOVER.md).
  virtual void SetPeers(std::vector<std::string> endpoints) = 0;
  virtual uint64_t epoch() const = 0;
  // The job-wide telemetry this host aggregates from every node's heartbeats.
  virtual std::shared_ptr<telemetry::JobTelemetry> telemetry() const = 0;
};

struct HostOptions {
  Config config;
  std::string run_id;
  std::string token;
  std::string listen_address;  // host:port (port 0: pick one)
  TlsConfig tls;
  uint64_t epoch = 1;        // this host's epoch (docs/FAILOVER.md)
  std::string host_node_id;  // the hosting agent's node id (empty: stand-alone)
  std::string candidates;    // the explicit candidate list, if any
  telemetry::TelemetryOptions telemetry;  // straggler factor and windows (docs/TELEMETRY.md)
  // `dlrun rdzv-server --metrics-port`: serve /metrics, /api/job and / there (-1: off).
  int metrics_port = defaults::kMetricsPortOff;
  std::string metrics_addr = defaults::kMetricsAddr;
};

class Api {
 public:
  virtual ~Api() = default;
  // `dlrun rdzv-server`, with its options parsed by the launcher (launcher/cli/rdzv_server_cli.h):
  // serves until the job ends; returns 0 when it succeeded, 1 when it failed, 2 when the server
  // cannot start.
  virtual int Serve(const HostOptions& options) = 0;
  virtual std::unique_ptr<RendezvousClient> CreateClient(const ClientOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<HostedRendezvous>> Host(const HostOptions& options) = 0;
  // Serves `telemetry` over HTTP on addr:port (port 0: pick one); logs where.
  virtual absl::StatusOr<std::unique_ptr<telemetry::MetricsServer>> ServeMetrics(
      std::shared_ptr<telemetry::JobTelemetry> telemetry, const std::string& addr, int port) = 0;
};

}  // namespace dlrun::rdzv

// The plugin's one exported symbol.
extern "C" dlrun::rdzv::Api* dlrun_rdzv_api();
