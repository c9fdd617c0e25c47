#include "launcher/profile/live_profile.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "launcher/profile/profiler.h"
#include "nlohmann/json.hpp"
#include "telemetry/profile_json.h"

namespace dlrun::launcher {

using nlohmann::json;

absl::StatusOr<ProfileSpec> LiveProfileSpec(const rdzv::ProfileAsk& ask) {
  ProfileSpec spec;
  auto tool = ParseProfileTool(ask.tool);
  if (!tool.ok()) return tool.status();
  if (*tool != ProfileTool::kPySpy && *tool != ProfileTool::kPerf) {
    return absl::InvalidArgumentError(absl::StrCat(
        ask.tool, " cannot attach to a running process: dlrun profile runs py-spy or perf; for ",
        ask.tool, ", start the job with --profile ", ask.tool, " --profile-ranks"));
  }
  spec.tool = *tool;
  spec.ranks = ask.ranks;
  auto args = SplitProfileArgs(ask.args);
  if (!args.ok()) return args.status();
  spec.args = *std::move(args);
  return spec;
}

std::vector<telemetry::RankProfile> ProfileLive(const ProfileSpec& spec, const std::string& tool,
                                           const std::string& dir, const std::string& host,
                                           const std::vector<DumpTarget>& targets,
                                           std::chrono::milliseconds duration,
                                           std::chrono::milliseconds bound) {
  // No step range: perf starts enabled and py-spy at once, both at Started; Collect stops them.
  std::unique_ptr<RankProfiler> profiler = MakeToolProfiler(spec, tool, dir, host);
  bool any = false;
  for (const DumpTarget& t : targets) {
    if (!spec.Wants(t.rank) || t.pid <= 0) continue;
    profiler->Started(t.rank, t.pid);
    any = true;
  }
  if (!any) return {};
  std::this_thread::sleep_for(duration);  // the capture itself: the tools sample meanwhile
  return profiler->Collect(bound);
}

std::string AnswerLiveProfile(const rdzv::ProfileAsk& ask, const std::vector<DumpTarget>& targets,
                              const std::string& dir, const std::string& host,
                              const std::string& python) {
  constexpr size_t kMaxAnswerBytes = 60 * 1024;  // the rendezvous takes at most 64 KB a post
  absl::StatusOr<ProfileSpec> spec = LiveProfileSpec(ask);
  absl::StatusOr<std::string> tool =
      spec.ok() ? FindProfileTool(*spec, python) : absl::StatusOr<std::string>(spec.status());
  if (!tool.ok()) {
    std::vector<telemetry::RankProfile> notes;
    for (const DumpTarget& t : targets) {
      if (std::find(ask.ranks.begin(), ask.ranks.end(), t.rank) == ask.ranks.end()) continue;
      notes.push_back({t.rank, host, ask.tool, "", {}, std::string(tool.status().message())});
    }
    return LiveProfilesJson(notes, kMaxAnswerBytes);
  }
  const auto bound = std::chrono::seconds(120);  // perf script over a large capture takes a while
  return LiveProfilesJson(ProfileLive(*spec, *tool, dir, host, targets,
                                      std::chrono::milliseconds(ask.duration_ms), bound),
                          kMaxAnswerBytes);
}

std::string LiveProfilesJson(const std::vector<telemetry::RankProfile>& profiles, size_t max_bytes) {
  std::vector<telemetry::RankProfile> p = profiles;
  for (;;) {
    json out = json::array();
    size_t hot_left = 0;
    for (const telemetry::RankProfile& r : p) {
      hot_left += r.hot.size();
      out.push_back(telemetry::ProfileDetailJson(r));
    }
    std::string text = out.dump(-1, ' ', false, json::error_handler_t::replace);
    if (text.size() <= max_bytes || hot_left == 0) return text.size() <= max_bytes ? text : "[]";
    for (telemetry::RankProfile& r : p) {  // the least telling frames go first
      if (!r.hot.empty()) r.hot.pop_back();
    }
  }
}

absl::StatusOr<std::vector<telemetry::RankProfile>> LiveProfilesFromJson(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return absl::InvalidArgumentError("the node's profiles are not a JSON array");
  std::vector<telemetry::RankProfile> out;
  try {
    for (const json& e : j) {
      telemetry::RankProfile p;
      p.rank = e.at("rank").get<int>();
      p.host = e.at("host").get<std::string>();
      p.tool = e.at("tool").get<std::string>();
      p.path = e.at("path").get<std::string>();
      p.note = e.at("note").get<std::string>();
      p.samples = e.value("samples", int64_t{0});
      for (const json& h : e.at("hot")) {
        p.hot.emplace_back(h.at("frame").get<std::string>(), h.at("fraction").get<double>());
      }
      out.push_back(std::move(p));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the node's profiles: ", e.what()));
  }
  return out;
}

std::string FormatLiveProfiles(const std::vector<telemetry::RankProfile>& profiles,
                               const std::vector<std::string>& notes) {
  std::string out;
  for (const telemetry::RankProfile& p : profiles) absl::StrAppend(&out, telemetry::ProfileText(p, ""), "\n");
  for (const std::string& n : notes) absl::StrAppend(&out, n, "\n");
  return out;
}

}  // namespace dlrun::launcher
