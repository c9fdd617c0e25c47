#include "launcher/workers/diagnostics.h"

#include "absl/strings/str_cat.h"
#include "common/defaults.h"
#include "launcher/profile/live_profile.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

void DiagnosticsResponder::Poll(const std::vector<DumpTarget>& live) {
  PostReady(std::chrono::seconds(0));
  JobChannel::Wanted wanted = channel_.DiagnosticsWanted();
  const uint64_t id = wanted.id;
  if (id == 0 || answering_) return;
  if (std::optional<rdzv::ProfileAsk> ask = std::move(wanted.profile)) {
    // `dlrun profile`: the capture lasts its duration; a later check posts the answer.
    answering_.emplace(id, std::async(std::launch::async,
                                      [ask = *std::move(ask), live, run = options_.live_profile] {
                                        return run ? run(ask, live) : std::string("[]");
                                      }));
    answering_profile_ = true;
    return;
  }
  // The dump itself here (milliseconds: py-spy reads without stopping, eu-stack only unwinds);
  // naming native frames can take seconds, during which the agent's loop must go on
  // heartbeating, so it runs on a thread of its own and the answer goes with a later check.
  std::vector<RankStack> ranks;
  if (options_.dump_stacks && !live.empty()) {
    ranks = options_.dump_stacks(live, defaults::kStacksBound);
  }
  answering_.emplace(id, std::async(std::launch::async, [ranks = std::move(ranks),
                                                         name = options_.name_frames]() mutable {
                       if (name) name(&ranks);
                       // The rendezvous takes at most 64 KB from a node.
                       return RankStacksJson(std::move(ranks), 60 * 1024);
                     }));
  // Python frames come named: most answers are ready at once and go now, not a check later.
  PostReady(std::chrono::seconds(1));
}

void DiagnosticsResponder::PostReady(std::chrono::milliseconds wait) {
  // From the agent's thread: the job channel's client is that thread's.
  if (!answering_ || answering_->second.wait_for(wait) != std::future_status::ready) return;
  const std::string answer = answering_->second.get();
  channel_.PostDiagnostics(answering_->first, answer);
  answering_.reset();
  if (!answering_profile_) return;
  answering_profile_ = false;  // also on the live page and in the report, by rank
  auto got = LiveProfilesFromJson(answer);
  if (!got.ok()) return;
  for (telemetry::RankProfile& p : *got) {
    if (p.path.empty()) continue;
    std::erase_if(live_profiles_,
                  [&](const telemetry::RankProfile& q) { return q.rank == p.rank; });
    live_profiles_.push_back(std::move(p));
  }
  PublishProfiles();
}

void DiagnosticsResponder::CollectProfiles() {
  if (!options_.profiler) return;
  std::vector<telemetry::RankProfile> got = options_.profiler->Collect(options_.profile_bound);
  for (const telemetry::RankProfile& p : got) {
    // Once each: the agent collects again after the last group, which it may have collected.
    if (!profiles_said_.insert(absl::StrCat(p.rank, " ", p.path, " ", p.note)).second) continue;
    if (!p.path.empty()) {
      spdlog::info("rank {} profile ({}): {}{}", p.rank, p.tool, p.path,
                   p.note.empty() ? "" : " (" + p.note + ")");
    } else {
      spdlog::warn("rank {} has no {} profile: {}", p.rank, p.tool, p.note);
    }
  }
  collected_profiles_ = std::move(got);
  PublishProfiles();
}

void DiagnosticsResponder::PublishProfiles() {
  std::vector<telemetry::RankProfile> all = collected_profiles_;
  all.insert(all.end(), live_profiles_.begin(), live_profiles_.end());
  telemetry_.SetProfiles(std::move(all));
}

}  // namespace dlrun::launcher
