// `dlrun stacks`: the current stacks of every worker of a running job, grouped (docs/STACKS.md).
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "launcher/app/commands.h"
#include "launcher/app/find_run.h"
#include "common/defaults.h"
#include "launcher/cli/flags.h"
#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {
namespace {

// Every node's workers, through the job's rendezvous: each agent dumps its own on its next
// heartbeat and posts them (docs/STACKS.md).
absl::StatusOr<StackReport> JobWide(const std::string& endpoint, const std::string& run_id,
                                    const std::string& token, std::chrono::milliseconds timeout) {
  auto client = JobClient(endpoint, run_id, token);
  if (!client.ok()) return client.status();
  // Each agent answers on its next heartbeat, then dumps for up to its own bound.
  auto nodes = (*client)->CollectStacks(timeout + defaults::kStacksBound);
  if (!nodes.ok()) {
    return absl::Status(nodes.status().code(),
                        absl::StrCat("the rendezvous at ", endpoint, " (run id '", run_id,
                                     "'): ", nodes.status().message()));
  }
  std::vector<RankStack> ranks;
  std::vector<std::pair<std::string, std::string>> missing_nodes;
  for (const rdzv::NodeStacksReply& n : *nodes) {
    if (n.ranks_json.empty()) {
      missing_nodes.emplace_back(n.hostname, "its agent did not answer in time");
      continue;
    }
    auto r = RankStacksFromJson(n.ranks_json);
    if (!r.ok()) {
      missing_nodes.emplace_back(n.hostname, std::string(r.status().message()));
      continue;
    }
    ranks.insert(ranks.end(), r->begin(), r->end());
  }
  StackReport report = GroupStacks(std::move(ranks));
  report.missing_nodes = std::move(missing_nodes);
  return report;
}

}  // namespace

int StacksMain(const std::vector<std::string>& args) {
  auto parsed = ParseStacksArgs(args);
  if (!parsed.ok()) return Fail(parsed.status());
  const StacksArgs& a = *parsed;
  if (a.help) return Print(StacksUsage());
  if (a.version) return Print(cli::VersionText());
  const auto t0 = std::chrono::steady_clock::now();
  auto print = [&a, t0](StackReport report) {
    report.took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Print(a.json ? StackReportJson(report, 2) + "\n" : FormatStackReport(report));
    return report.groups.empty() ? 1 : 0;
  };
  auto job = ChooseJob(a.job);
  if (!job.ok()) return absl::IsInvalidArgument(job.status()) ? Fail(job.status()) : FailRun(job.status());
  if (!job->endpoint.empty()) {
    auto report = JobWide(job->endpoint, job->run_id, job->token, a.timeout);
    if (!report.ok()) return FailRun(report.status());
    report->job = job->run_id;
    return print(*std::move(report));
  }
  const WorkersFile& w = job->run->workers;
  StackReport report = GroupStacks(DumpStacks(w.workers, FindStackTools(), w.host, a.timeout));
  report.job = absl::StrCat(w.run_id, " (agent pid ", w.agent_pid, ")");
  return print(std::move(report));
}

}  // namespace dlrun::launcher
