// `dlrun profile` on a running job (docs/PROFILING.md, "On a running job"): attach py-spy or
// perf to some live workers for a while, then the same files and hot frames as --profile. Each
// node's agent runs it for its own ranks when the rendezvous asks (a job-wide request rides on
// `dlrun stacks`'s); a single-node job's `dlrun profile` runs it itself.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/profile/profile.h"
#include "launcher/stacks/stacks.h"
#include "telemetry/telemetry.h"
#include "rendezvous/types.h"

namespace dlrun::launcher {

// The ask as a ProfileSpec (its tool, ranks and args), or why it cannot be run here.
absl::StatusOr<ProfileSpec> LiveProfileSpec(const rdzv::ProfileAsk& ask);

// Runs `tool` (FindProfileTool's) on the `targets` the ask names for `duration`, into `dir`, and
// returns their profiles (hot frames, flame graph paths); waits at most `bound` beyond the
// duration for the tools to finish. Targets the ask does not name are left alone.
std::vector<telemetry::RankProfile> ProfileLive(const ProfileSpec& spec, const std::string& tool,
                                           const std::string& dir, const std::string& host,
                                           const std::vector<DumpTarget>& targets,
                                           std::chrono::milliseconds duration,
                                           std::chrono::milliseconds bound);

// A node's whole answer to `ask` (what the agent posts): ProfileLive on the targets it names,
// with the tool found as --profile finds it (`python`: the workers' interpreter, for py-spy);
// a tool that cannot run is a note on each asked rank of this node. Files go to `dir`.
std::string AnswerLiveProfile(const rdzv::ProfileAsk& ask, const std::vector<DumpTarget>& targets,
                              const std::string& dir, const std::string& host,
                              const std::string& python);

// A node's answer as JSON, at most `max_bytes` (hot frames dropped from the end to fit), and back.
std::string LiveProfilesJson(const std::vector<telemetry::RankProfile>& profiles, size_t max_bytes);
absl::StatusOr<std::vector<telemetry::RankProfile>> LiveProfilesFromJson(const std::string& json);

// What `dlrun profile` prints: one line per rank with its file, then its hot frames.
std::string FormatLiveProfiles(const std::vector<telemetry::RankProfile>& profiles,
                               const std::vector<std::string>& notes);

}  // namespace dlrun::launcher
