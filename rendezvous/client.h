// The client agents use to talk to the rendezvous. Blocking calls with deadlines; one instance
// per agent, safe to use from several threads.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "telemetry/telemetry.h"
#include "rendezvous/tls.h"
#include "rendezvous/types.h"

namespace dlrun::rdzv {

struct ClientOptions {
  std::string endpoint;  // host:port
  std::string run_id;
  std::string token;
  Duration rpc_timeout{std::chrono::seconds(10)};  // failure, leave, status
  // A heartbeat that takes longer counts as a miss: the agent's liveness clock keeps running
  // while a dead host's connection times out. Agents set their heartbeat interval here
  // (launcher/rdzv/rdzv_source.cc, ClientFor).
  Duration heartbeat_timeout{std::chrono::seconds(1)};
  TlsConfig tls;  // mutual TLS when enabled (rendezvous/tls.h)
  std::string candidates;  // the explicit candidate list, sent with every join
};

class RendezvousClient {
 public:
  virtual ~RendezvousClient() = default;
  // Blocks until the round closes, the job fails, or `timeout` passes. A host that stepped down
  // answers with a redirect instead of an assignment.
  virtual absl::StatusOr<JoinResult> Join(const NodeInfo& node, Duration timeout) = 0;
  // `in_process`: every worker of this node declared in-process recovery (docs/RECOVERY.md).
  virtual absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& node_id, uint64_t round,
                                                   bool in_process = false) = 0;
  // `fatal`: stop the job instead of opening a new round (a failure that repeats).
  // `fallback`: the restart replaces an in-process recovery; not counted as a restart.
  virtual absl::StatusOr<FailureReply> ReportFailure(const std::string& node_id, uint64_t round,
                                                     const std::string& reason, bool fatal,
                                                     bool fallback) = 0;
  virtual absl::Status Leave(const std::string& node_id, uint64_t round, bool success) = 0;
  // `wait` > 0: wait that long for the server to come up (a failover host starting);
  // 0: fail at once when nobody listens. Else the deadline is rpc_timeout.
  virtual absl::StatusOr<StatusSnapshot> Status(Duration wait = Duration(0)) = 0;

  // The job channel (proto `service JobChannel`, on the same connection).
  // This node's figures (optional; docs/TELEMETRY.md); the answer is what the job asks of it.
  virtual absl::StatusOr<DiagnosticsAsk> Publish(const std::string& node_id,
                                                 const telemetry::NodeTelemetry* telemetry) {
    return absl::UnimplementedError("publish");
  }
  // `dlrun stacks` for the whole job (docs/STACKS.md): every member's stacks, or its name
  // with empty ranks_json when it did not answer within `timeout`.
  // With `profile`: `dlrun profile` (docs/PROFILING.md); each node's ranks_json holds its
  // profiles.
  virtual absl::StatusOr<std::vector<NodeStacksReply>> CollectStacks(
      Duration timeout, const ProfileAsk* profile = nullptr) {
    return absl::UnimplementedError("stacks");
  }
  // This node's answer to DiagnosticsAsk::request.
  virtual absl::Status PostDiagnostics(uint64_t request_id, const NodeStacksReply& stacks) {
    return absl::UnimplementedError("stacks");
  }
  // In-process recovery across nodes (proto `service Regroup`; docs/RECOVERY.md): ask for the
  // round's next generation, or post its port; the answer is the regroup as it stands.
  virtual absl::StatusOr<RegroupNotice> AskRegroup(const std::string& node_id,
                                                   const RegroupAsk& ask) {
    return absl::UnimplementedError("regroup");
  }
  // Held until the job's regroup differs from `known` (its round, generation and port) or
  // `timeout` passed. `on_call` is called with a function that cancels the call while it is
  // held, and with an empty one when it returns.
  using CancelHook = std::function<void(std::function<void()>)>;
  virtual absl::StatusOr<RegroupNotice> WatchRegroup(const std::string& node_id,
                                                     const RegroupNotice& known, Duration timeout,
                                                     const CancelHook& on_call) {
    return absl::UnimplementedError("regroup");
  }
  // The highest host epoch this agent has seen, sent with every call.
  virtual void set_epoch(uint64_t epoch) = 0;
  virtual const std::string& endpoint() const = 0;

  static std::unique_ptr<RendezvousClient> Create(const ClientOptions& options);
};

}  // namespace dlrun::rdzv
