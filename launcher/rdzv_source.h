// Membership from dlrun's gRPC rendezvous (multi-node): join, heartbeat, report failures.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/agent.h"
#include "launcher/options.h"
#include "rendezvous/tls.h"

namespace dlrun::launcher {

struct RdzvSourceOptions {
  std::string endpoint;     // host:port
  std::string run_id;
  std::string token;
  std::string local_addr;   // this node's address (MASTER_ADDR if it gets node rank 0)
  std::string hostname;
  int nproc = 1;
  int slurm_node_id = -1;
  int min_nodes = 1;
  int max_nodes = 1;
  int max_restarts = 0;
  std::string role = "default";
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds last_call{std::chrono::seconds(30)};
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  int heartbeat_misses = 5;
  std::vector<std::string> expected_hosts;  // named in a join-timeout error
  // "auto": host the server if the endpoint's port can be bound here; "true"/"false" force it.
  std::string is_host = "auto";
  rdzv::TlsConfig tls;  // from DLRUN_RDZV_TLS_* (rendezvous/tls.h)
};

// Parses --rdzv-conf "key=value,...": join_timeout, last_call_timeout, close_timeout,
// read_timeout (seconds), heartbeat_interval (seconds), heartbeat_misses, is_host.
absl::Status ApplyRdzvConf(const std::string& conf, RdzvSourceOptions* o);

// Starts the hosted server when this agent hosts it, and the client.
absl::StatusOr<std::unique_ptr<MembershipSource>> MakeRendezvousSource(RdzvSourceOptions o);

}  // namespace dlrun::launcher
