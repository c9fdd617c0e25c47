// `dlrun profile`: py-spy or perf on some ranks of a running job for a while, on whichever node
// runs them (docs/PROFILING.md, "On a running job").
#include <unistd.h>

#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "launcher/app/commands.h"
#include "launcher/app/find_run.h"
#include "launcher/cli/flags.h"
#include "launcher/profile/live_profile.h"
#include "launcher/profile/profiler.h"
#include "nlohmann/json.hpp"
#include "telemetry/profile_json.h"

namespace dlrun::launcher {
namespace {

// The workers' interpreter (for py-spy beside it): the first one InterpreterOf can read.
std::string InterpreterOfAny(const std::vector<DumpTarget>& targets) {
  for (const DumpTarget& t : targets) {
    if (std::string python = InterpreterOf(t.pid); !python.empty()) return python;
  }
  return "";
}

// Every node's answer, through the job's rendezvous.
absl::StatusOr<std::vector<telemetry::RankProfile>> JobWide(const std::string& endpoint,
                                                       const std::string& run_id,
                                                       const std::string& token,
                                                       const rdzv::ProfileAsk& ask,
                                                       std::vector<std::string>* notes) {
  auto client = JobClient(endpoint, run_id, token);
  if (!client.ok()) return client.status();
  // Each agent starts on its next heartbeat, samples for the duration, then draws the graphs.
  const auto timeout = std::chrono::milliseconds(ask.duration_ms) + std::chrono::seconds(150);
  auto nodes = (*client)->CollectStacks(timeout, &ask);
  if (!nodes.ok()) {
    return absl::Status(nodes.status().code(),
                        absl::StrCat("the rendezvous at ", endpoint, " (run id '", run_id,
                                     "'): ", nodes.status().message()));
  }
  std::vector<telemetry::RankProfile> out;
  for (const rdzv::NodeStacksReply& n : *nodes) {
    if (n.ranks_json.empty()) {
      notes->push_back(absl::StrCat("node ", n.hostname, ": its agent did not answer in time"));
      continue;
    }
    auto p = LiveProfilesFromJson(n.ranks_json);
    if (!p.ok()) {
      notes->push_back(absl::StrCat("node ", n.hostname, ": ", p.status().message()));
      continue;
    }
    out.insert(out.end(), p->begin(), p->end());
  }
  return out;
}

std::string ProfilesJson(const std::vector<telemetry::RankProfile>& profiles,
                         const std::vector<std::string>& notes) {
  nlohmann::json j;
  j["profiles"] = nlohmann::json::object();
  for (const telemetry::RankProfile& p : profiles) {
    if (!p.path.empty()) j["profiles"][std::to_string(p.rank)] = p.path;
  }
  j["profile_details"] = nlohmann::json::array();
  for (const telemetry::RankProfile& p : profiles) j["profile_details"].push_back(telemetry::ProfileDetailJson(p));
  j["notes"] = notes;
  return j.dump(2) + "\n";
}

}  // namespace

int ProfileMain(const std::vector<std::string>& args) {
  auto parsed = ParseProfileArgs(args);
  if (!parsed.ok()) return Fail(parsed.status());
  const ProfileArgs& a = *parsed;
  if (a.help) return Print(ProfileUsage());
  if (a.version) return Print(cli::VersionText());
  const std::vector<int>* ranks = &a.rank_list;
  const rdzv::ProfileAsk ask{a.tool, a.rank_list, a.duration.count(), a.args};
  auto spec = LiveProfileSpec(ask);
  if (!spec.ok()) return Fail(spec.status());

  std::vector<std::string> notes;
  absl::StatusOr<std::vector<telemetry::RankProfile>> profiles;
  auto job = ChooseJob(a.job);
  if (!job.ok()) return absl::IsInvalidArgument(job.status()) ? Fail(job.status()) : FailRun(job.status());
  if (!job->endpoint.empty()) {
    profiles = JobWide(job->endpoint, job->run_id, job->token, ask, &notes);
  } else {
    const WorkersFile& w = job->run->workers;
    auto tool = FindProfileTool(*spec, InterpreterOfAny(w.workers));
    if (!tool.ok()) return FailRun(tool.status());
    profiles = ProfileLive(*spec, *tool, absl::StrCat(job->run->run_dir, "/profile/live-", getpid()),
                           w.host, w.workers, a.duration, std::chrono::seconds(120));
  }
  if (!profiles.ok()) return FailRun(profiles.status());
  std::set<int> seen;
  for (const telemetry::RankProfile& p : *profiles) seen.insert(p.rank);
  for (int r : *ranks) {
    if (!seen.count(r)) notes.push_back(absl::StrCat("rank ", r, ": no live worker of the job has it"));
  }
  Print(a.json ? ProfilesJson(*profiles, notes) : FormatLiveProfiles(*profiles, notes));
  for (const telemetry::RankProfile& p : *profiles) {
    if (!p.path.empty()) return 0;
  }
  return 1;
}

}  // namespace dlrun::launcher
