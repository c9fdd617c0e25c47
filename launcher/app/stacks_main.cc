// `dlrun stacks`: the current stacks of every worker of a running job, grouped (docs/STACKS.md).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/app/commands.h"
#include "launcher/app/find_run.h"
#include "launcher/app/run_dir.h"
#include "common/contract.h"
#include "common/defaults.h"
#include "common/env.h"
#include "launcher/cli/flags.h"
#include "launcher/rdzv/rdzv_config.h"
#include "launcher/rdzv/rdzv_loader.h"
#include "rendezvous/tls.h"
#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {
namespace {

struct StacksArgs {
  bool json = false;
  std::string log_dir;
  std::string run_id;
  std::string rdzv_endpoint;  // a job elsewhere, with run_id
  bool this_node = false;
  std::chrono::milliseconds timeout = defaults::kStacksBound;
};

std::vector<cli::Flag<StacksArgs>> Flags() {
  return {
      {"json", "", false, cli::BoolField(&StacksArgs::json),
       "print the groups, suspects and missing ranks as JSON"},
      {"log-dir", "", true, cli::StrField(&StacksArgs::log_dir),
       "the job's run directory, or the --log-dir it was started with"},
      {"run-id", "", true, cli::StrField(&StacksArgs::run_id),
       "the job's run id (--rdzv-id), when several jobs run on this node"},
      {"rdzv-id", "", true, cli::StrField(&StacksArgs::run_id), "the same as --run-id"},
      {"rdzv-endpoint", "", true, cli::StrField(&StacksArgs::rdzv_endpoint),
       absl::StrCat("HOST:PORT of a multi-node job's rendezvous, for a job that runs elsewhere "
                    "(with --rdzv-id; the token from ", contract::kRdzvToken, ")")},
      {"this-node", "", false, cli::BoolField(&StacksArgs::this_node),
       "only this node's workers, not every node's of a multi-node job"},
      {"timeout", "", true, cli::DurationField("timeout", &StacksArgs::timeout, false),
       absl::StrCat("seconds to wait for the dumps (default ", defaults::kStacksBound.count() / 1000,
                    "); a rank or node not read by then is listed as missing")},
  };
}

std::string StacksUsage() {
  return cli::Usage(
      "usage: dlrun stacks [options]\n"
      "The current stacks of every worker of a running dlrun job, on every node of a multi-node\n"
      "one: ranks with the same stack share one entry, and the ranks whose stack differs are\n"
      "the suspects. Python workers are read with py-spy, native ones with eu-stack\n"
      "(docs/STACKS.md). The job is the one dlrun job on this node, or --run-id/--log-dir's,\n"
      "or --rdzv-endpoint/--rdzv-id's elsewhere.\n",
      Flags());
}

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
  StacksArgs a;
  auto parsed = cli::ParseFlags(cli::ParseSpec{"dlrun stacks", /*wants_program=*/false}, Flags(),
                                args, a);
  if (!parsed.ok()) return Fail(parsed.status());
  if (parsed->help) return Print(StacksUsage());
  if (parsed->version) return Print(cli::VersionText());
  const auto t0 = std::chrono::steady_clock::now();
  auto print = [&a, t0](StackReport report) {
    report.took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Print(a.json ? StackReportJson(report, 2) + "\n" : FormatStackReport(report));
    return report.groups.empty() ? 1 : 0;
  };
  if (!a.rdzv_endpoint.empty()) {  // a job elsewhere
    if (a.run_id.empty()) {
      return Fail(absl::InvalidArgumentError("--rdzv-endpoint needs the job's --rdzv-id"));
    }
    auto token = JobToken(ProcessEnv(), a.run_id);
    if (!token.ok()) return Fail(token.status());
    auto report = JobWide(a.rdzv_endpoint, a.run_id, *token, a.timeout);
    if (!report.ok()) return FailRun(report.status());
    return print(*std::move(report));
  }
  auto run = FindRun(a.log_dir, a.run_id);
  if (!run.ok()) return absl::IsInvalidArgument(run.status()) ? Fail(run.status()) : FailRun(run.status());
  const WorkersFile& w = run->workers;
  if (!w.rdzv_endpoint.empty() && !a.this_node) {
    auto report = JobWide(w.rdzv_endpoint, w.run_id, w.rdzv_token, a.timeout);
    if (!report.ok()) return FailRun(report.status());
    return print(*std::move(report));
  }
  return print(GroupStacks(DumpStacks(w.workers, FindStackTools(), w.host, a.timeout)));
}

}  // namespace dlrun::launcher
