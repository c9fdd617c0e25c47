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

struct ProfileArgs : cli::CommandLine {
  std::string ranks;
  std::chrono::milliseconds duration{10000};
  std::string tool = "py-spy";
  std::string args;
  bool json = false;
  JobChoice job;
};

std::vector<cli::Flag<ProfileArgs>> Flags() {
  std::vector<cli::Flag<ProfileArgs>> flags = {
      {"ranks", "", true, cli::StrField(&ProfileArgs::ranks),
       "the global ranks to profile, e.g. 3 or 0,2-3 (required)"},
      {"duration", "", true, cli::DurationField("duration", &ProfileArgs::duration, false),
       "how long to sample, e.g. 10s (default 10s)"},
      {"tool", "", true, cli::StrField(&ProfileArgs::tool),
       "py-spy (Python workers) or perf (native ones; any process); default py-spy"},
      {"args", "", true, cli::StrField(&ProfileArgs::args), "more arguments for the tool"},
      {"json", "", false, cli::BoolField(&ProfileArgs::json),
       "print the profiles as --report-json does (\"profiles\", \"profile_details\")"},
  };
  AddJobFlags(&flags, &ProfileArgs::job, "only this node's workers, not the whole job's");
  return flags;
}

std::string ProfileUsage() {
  return cli::Usage(
      "usage: dlrun profile --ranks LIST [--duration 10s] [--tool py-spy|perf] [options]\n"
      "Attaches py-spy or perf to the listed ranks of a running dlrun job, on whichever node\n"
      "runs them, for --duration, and prints each rank's flame graph (an SVG on that node) and\n"
      "the frames it spent most time in (docs/PROFILING.md). nsys cannot attach to a running\n"
      "process: start the job with --profile nsys instead. The job is the one dlrun job on this\n"
      "node, or --run-id/--log-dir's, or --rdzv-endpoint/--rdzv-id's elsewhere.\n",
      Flags());
}

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
  ProfileArgs a;
  auto parsed = cli::ParseCommand(cli::ParseSpec{"dlrun profile", /*wants_program=*/false}, Flags(),
                                 args, a);
  if (!parsed.ok()) return Fail(parsed.status());
  if (a.help) return Print(ProfileUsage());
  if (a.version) return Print(cli::VersionText());
  if (a.ranks.empty()) return Fail(absl::InvalidArgumentError("dlrun profile needs --ranks (e.g. --ranks 3)"));
  auto ranks = ParseRankList("ranks", a.ranks);
  if (!ranks.ok()) return Fail(ranks.status());
  const rdzv::ProfileAsk ask{a.tool, *ranks, a.duration.count(), a.args};
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
