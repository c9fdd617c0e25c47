// Maps rendezvous proto messages to the state machine: checks the protocol version, run id and
// token of every request and the shape of every message before anything reaches the state, and
// serialises access. No gRPC here (the service adapts it); thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dlrun/proto/rendezvous.pb.h"
#include "rendezvous/state_machine.h"
#include "telemetry/telemetry.h"
#include "telemetry/telemetry_proto.h"

namespace dlrun::rdzv {

// 2: host epochs, failover joins and redirects (docs/FAILOVER.md).
// 3: the job channel (telemetry, stacks, profiles) is its own service, JobChannel; heartbeats
//    and leaves carry membership only.
inline constexpr uint32_t kProtocolVersion = 3;
// Largest message the service accepts; a join is a few hundred bytes.
inline constexpr int kMaxMessageBytes = 64 * 1024;
// What a client accepts: a `dlrun stacks` answer gathers every node's post (docs/STACKS.md).
inline constexpr int kMaxStacksResponseBytes = 64 * 1024 * 1024;

struct HandlerOptions {
  Config config;
  std::string run_id;
  std::string token;  // per-job secret; empty only in tests that say so
  std::function<TimePoint()> now = [] { return Clock::now(); };
  // This host's epoch (docs/FAILOVER.md): 1 for the first host of a job, one more than the
  // lost host's for a host that took over. Calls from agents that have seen a newer epoch are
  // refused.
  uint64_t epoch = 1;
  // The node id of the agent hosting this server (empty for `dlrun rdzv-server`): left out of
  // the successors, since it cannot take over from itself.
  std::string host_node_id;
  // The explicit candidate list (--rdzv-endpoint a,b,...) this host was started with; a join
  // naming another list is refused with both.
  std::string candidates;
  // The job's aggregate (docs/TELEMETRY.md): this handler tells it the job's state (round,
  // world size, restarts), the ChannelHandler over it the nodes' figures; null: none.
  std::shared_ptr<telemetry::JobTelemetry> telemetry;
  // Called (outside the lock) for every refused request, e.g. to log it.
  std::function<void(const absl::Status&, const std::string& peer)> on_refused;
};

class Handler {
 public:
  explicit Handler(HandlerOptions options);

  using JoinDone = std::function<void(const absl::Status&, const v1::JoinResponse&)>;
  // A fresh ticket identifying one Join call (for CancelJoin).
  uint64_t NewTicket() { return next_ticket_.fetch_add(1); }
  // `done` runs exactly once: at once for a refused request, else when the round closes or
  // fails, unless CancelJoin(node, ticket) returned true first.
  void Join(const v1::JoinRequest& req, const std::string& peer, uint64_t ticket, JoinDone done);
  // Returns true if the join was still pending (then `done` will not run; finish the call).
  bool CancelJoin(const std::string& node_id, uint64_t ticket);

  absl::Status Heartbeat(const v1::HeartbeatRequest& req, const std::string& peer,
                         v1::HeartbeatResponse* resp);
  absl::Status ReportFailure(const v1::FailureReport& req, const std::string& peer,
                             v1::FailureResponse* resp);
  absl::Status Leave(const v1::LeaveRequest& req, const std::string& peer);
  absl::Status Status(const v1::StatusRequest& req, const std::string& peer,
                      v1::StatusResponse* resp);

  // A host with a newer epoch serves the job at `endpoint`: from now on every join and
  // heartbeat is answered with a redirect there. Returns false (and changes nothing) unless
  // `epoch` is newer than this host's.
  bool StepDown(const std::string& endpoint, uint64_t epoch);
  uint64_t epoch() const { return options_.epoch; }

  // Runs the state machine's timers; returns the next time it needs to run.
  std::optional<TimePoint> Tick();
  // In-process recovery across nodes (rendezvous/regroup.h): a member's regroup watch ended
  // without an answer, or it opened one; who hears of a round that goes on without a lost node
  // or with an admitted one (called outside the lock, from Tick or Join; set the listener
  // before serving); and the new group's port posted after an admission (StateMachine::Admitted).
  void WatchEnded(const std::string& node_id);
  void Heard(const std::string& node_id);
  void Admitted(uint64_t round, int generation, int port);
  void SetResizeListener(std::function<void(const Resize&)> listener) {
    on_resize_ = std::move(listener);
  }
  StateMachine::Phase phase();
  bool EndAcknowledged();
  uint64_t round();

  // For the job channel (rendezvous/job_channel.h), which shares this job's callers:
  // the caller's run, token, protocol version and epoch, checked; a refusal is logged.
  absl::Status Authorize(const v1::Auth& auth, const std::string& peer);
  // Logs `s` through on_refused and returns it.
  absl::Status Refuse(absl::Status s, const std::string& peer);
  // The members of the running round that have not left: node id -> host name.
  std::map<std::string, std::string> LiveMembers();
  TimePoint Now() const { return options_.now(); }
  const std::shared_ptr<telemetry::JobTelemetry>& telemetry() const { return options_.telemetry; }

 private:
  static void Deliver(Deliveries& d);

  HandlerOptions options_;
  // std::mutex rather than absl::Mutex: Debian's abseil is not built with ThreadSanitizer,
  // which then cannot see absl::Mutex's ordering (scripts/test-sanitizers tsan).
  std::mutex mu_;
  StateMachine machine_;  // guarded by mu_
  std::string redirect_;   // guarded by mu_: set once this host stepped down
  // Guarded by mu_: when the hosting agent's own node last joined or sent a heartbeat.
  std::optional<TimePoint> host_heard_;
  std::atomic<uint64_t> next_ticket_{1};
  // Guarded by mu_: the round and restart count last told to options_.telemetry.
  uint64_t telemetry_round_ = 0;
  int telemetry_restarts_ = 0;
  int telemetry_phase_ = -1;
  int telemetry_world_ = -1;
  std::function<void(const Resize&)> on_resize_;
};

// Converts between the proto and the plain types.
void ToProto(const Assignment& a, v1::Assignment* out);
Assignment FromProto(const v1::Assignment& a);
// Validates a NodeIdentity; errors name the field and the expected shape.
absl::StatusOr<NodeInfo> NodeFromProto(const v1::NodeIdentity& n);
// NodeTelemetry's conversion: telemetry/telemetry_proto.h.
using telemetry::ToProto;
using telemetry::TelemetryFromProto;

}  // namespace dlrun::rdzv
