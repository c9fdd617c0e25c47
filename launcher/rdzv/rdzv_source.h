// Membership from dlrun's gRPC rendezvous (multi-node): join, heartbeat, report failures.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/agent/membership.h"
#include "launcher/workers/clock.h"
#include "rendezvous/api.h"
#include "rendezvous/tls.h"
#include "rendezvous/types.h"
#include "telemetry/telemetry.h"

namespace dlrun::launcher {

struct RdzvSourceOptions {
  std::string endpoint;     // host:port of the first host
  // More than one --rdzv-endpoint entry: the explicit failover candidates, `endpoint` first.
  std::vector<std::string> candidates;
  // Endpoints that may already host this job when this agent starts (a node that comes back
  // must join the host that took over, not host a second one): the other nodes of the Slurm /
  // PMIx node list at the rendezvous port, at most kMaxSuccessors.
  std::vector<std::string> peers;
  std::string run_id;
  std::string token;        // JobToken() (launcher/cli/job_token.h)
  std::string local_addr;   // this node's address (MASTER_ADDR if it gets node rank 0)
  std::string hostname;
  int nproc = 1;
  int slurm_node_id = -1;
  std::string role = "default";
  // The agent recovers in process where its program declares it (not --recovery restart): the
  // job may admit this node into a running round (docs/RECOVERY.md, "A node that joins").
  bool in_process = false;
  // Nodes, restarts, timeouts and liveness: the same Config the server runs with, so a hosted
  // rendezvous, `dlrun rdzv-server` and the agents agree on when a node is dead.
  rdzv::Config config;
  // "auto": host the server if the endpoint's port can be bound here; "true"/"false" force it.
  std::string is_host = "auto";
  rdzv::TlsConfig tls;  // from the environment (rendezvous/tls.h)
  telemetry::TelemetryOptions telemetry;  // for the aggregate, when this agent hosts
  // The preflight (launcher/base/preflight.h), run once before the first join: its error ends
  // the join; its figure (the compute probe, GFLOP/s) goes with every join. When the round
  // leaves this node out, it is recorded in each of these bad-node lists
  // (launcher/base/bad_nodes.h) and the join fails with the reason.
  std::function<absl::StatusOr<double>()> preflight;
  std::vector<std::string> bad_nodes_files;
};

// Starts the hosted server when this agent hosts it, and the client (the plugin's, on the
// system clock).
absl::StatusOr<JobLink> MakeRendezvousSource(RdzvSourceOptions o);
// The same on a given rendezvous API and clock: tests drive the host's liveness limit and
// failover on a fake clock with a scripted client.
absl::StatusOr<JobLink> MakeRendezvousSource(RdzvSourceOptions o, rdzv::Api& api, Clock& clock);

}  // namespace dlrun::launcher
