// The client agents use to talk to the rendezvous. Blocking calls with deadlines; one instance
// per agent, safe to use from several threads.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/tls.h"
#include "rendezvous/types.h"

namespace dlrun::rdzv {

struct ClientOptions {
  std::string endpoint;  // host:port
  std::string run_id;
  std::string token;
  Duration rpc_timeout{std::chrono::seconds(10)};  // heartbeat, failure, leave
  TlsConfig tls;  // mutual TLS when enabled (rendezvous/tls.h)
};

class RendezvousClient {
 public:
  virtual ~RendezvousClient() = default;
  // Blocks until the round closes, the job fails, or `timeout` passes.
  virtual absl::StatusOr<Assignment> Join(const NodeInfo& node, Duration timeout) = 0;
  virtual absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& node_id, uint64_t round) = 0;
  virtual absl::StatusOr<FailureReply> ReportFailure(const std::string& node_id, uint64_t round,
                                                     const std::string& reason) = 0;
  virtual absl::Status Leave(const std::string& node_id, uint64_t round, bool success) = 0;
  virtual absl::StatusOr<StatusSnapshot> Status() = 0;

  static std::unique_ptr<RendezvousClient> Create(const ClientOptions& options);
};

}  // namespace dlrun::rdzv
