// The job channel's side of the service (proto `service JobChannel`): what the nodes tell the
// job (telemetry, docs/TELEMETRY.md) and what the job asks of them (stacks and profiles,
// docs/STACKS.md, docs/PROFILING.md). Membership (Handler) says who is in the job; this says
// what goes between the job and its members, and asks Handler only who they are.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dlrun/proto/rendezvous.pb.h"
#include "rendezvous/handler.h"
#include "telemetry/telemetry.h"

namespace dlrun::rdzv {

class ChannelHandler {
 public:
  // `membership` authenticates callers and names the live members; it outlives this.
  // Published figures go to its job aggregate (HandlerOptions::telemetry; none: dropped).
  explicit ChannelHandler(Handler& membership);

  // A member's latest figures (optional) and, in the answer, the diagnostics asked of it.
  // Malformed figures are refused (logged through the membership's on_refused) and dropped.
  absl::Status Publish(const v1::PublishRequest& req, const std::string& peer,
                       v1::PublishResponse* resp);

  // `dlrun stacks` / `dlrun profile` for the whole job: every live member is asked in its next
  // Publish answer; `done` runs exactly once, when each has posted, or at the timeout (Tick)
  // with the others under `missing`; at once for a refused request.
  using DiagnosticsDone = std::function<void(const absl::Status&, const v1::StacksResponse&)>;
  void CollectDiagnostics(const v1::StacksRequest& req, const std::string& peer,
                          DiagnosticsDone done);
  absl::Status PostDiagnostics(const v1::PostStacksRequest& req, const std::string& peer);

  // Ends the collections that are complete or past their timeout; returns the next timeout.
  std::optional<TimePoint> Tick();

 private:
  struct Collection {
    uint64_t id = 0;
    TimePoint deadline;
    std::map<std::string, std::string> waiting;  // node id -> host name
    v1::StacksResponse response;
    DiagnosticsDone done;
    std::optional<v1::ProfileAsk> profile;  // `dlrun profile`: asked of each member instead
  };
  // Ends the collections that are complete or past `now` (the caller runs `done` unlocked).
  std::vector<std::pair<DiagnosticsDone, v1::StacksResponse>> Finish(TimePoint now);

  Handler& membership_;
  std::shared_ptr<telemetry::JobTelemetry> telemetry_;
  std::mutex mu_;
  std::vector<Collection> collections_;  // guarded by mu_
  uint64_t next_id_ = 1;                 // guarded by mu_
};

}  // namespace dlrun::rdzv
