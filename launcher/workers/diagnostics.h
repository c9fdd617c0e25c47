// The agent's answers to what others ask of this node's workers (docs/STACKS.md,
// docs/PROFILING.md): a job-wide `dlrun stacks` or `dlrun profile` that arrives through the job
// channel, and --profile's results at the end of each group. Answers are prepared off the
// agent's loop (naming native frames, a profile's duration) and posted from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launcher/stacks/stacks.h"
#include "launcher/workers/agent_options.h"
#include "launcher/workers/agent_telemetry.h"
#include "launcher/workers/job_channel.h"

namespace dlrun::launcher {

class DiagnosticsResponder {
 public:
  // All outlive this (the agent's members).
  DiagnosticsResponder(const AgentOptions& options, JobChannel& channel, AgentTelemetry& telemetry)
      : options_(options), channel_(channel), telemetry_(telemetry) {}

  // Called at each check of the agent's loop with the live workers: posts an answer that is
  // ready, and starts one when the job channel asks (a dump of `live` now, named in the
  // background; or `dlrun profile`'s capture for its duration).
  void Poll(const std::vector<DumpTarget>& live);
  // --profile's captures of the group that ended, finished (within options.profile_bound),
  // said once each, and in the telemetry beside `dlrun profile`'s.
  void CollectProfiles();

 private:
  // Posts the answer being prepared if it is ready within `wait`.
  void PostReady(std::chrono::milliseconds wait);
  void PublishProfiles();

  const AgentOptions& options_;
  JobChannel& channel_;
  AgentTelemetry& telemetry_;
  // The answer being prepared: its request id and the JSON to post.
  std::optional<std::pair<uint64_t, std::future<std::string>>> answering_;
  bool answering_profile_ = false;  // answering_ is `dlrun profile`'s, not stacks
  // `dlrun profile`'s results on this node, shown beside --profile's (telemetry, live page).
  std::vector<telemetry::RankProfile> live_profiles_;
  std::vector<telemetry::RankProfile> collected_profiles_;  // --profile's
  std::set<std::string> profiles_said_;  // CollectProfiles' lines, each logged once
};

}  // namespace dlrun::launcher
