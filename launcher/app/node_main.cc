// `dlrun preflight`, `dlrun bad-nodes`, and the preflight a launch runs before it joins
// (docs/USAGE.md "Preflight and bad nodes").
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/app/commands.h"
#include "launcher/app/plan.h"
#include "launcher/base/bad_nodes.h"
#include "launcher/base/file_system.h"
#include "launcher/cli/node_cli.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

std::string Summary(const PreflightReport& r, double seconds) {
  std::vector<std::string> parts;
  for (const PreflightCheck& c : r.checks) parts.push_back(absl::StrCat(c.name, " ", c.detail));
  return absl::StrFormat("%s (%.1f s)", absl::StrJoin(parts, "; "), seconds);
}

std::string FormatSince(int64_t since) {
  char buf[32] = "?";
  const std::time_t t = static_cast<std::time_t>(since);
  std::tm tm{};
  if (localtime_r(&t, &tm) != nullptr) std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

// The GPUs this node's workers take: one each with --gpus per-worker or least-loaded, the ids
// given, or none counted (inherit: what the scheduler set).
int GpusNeeded(const LaunchOptions& o, int nproc) {
  switch (o.gpus.mode) {
    case GpuSpec::Mode::kPerWorker:
    case GpuSpec::Mode::kLeastLoaded: return nproc;
    case GpuSpec::Mode::kIds: return static_cast<int>(o.gpus.ids.size());
    case GpuSpec::Mode::kInherit: return 0;
  }
  return 0;
}

}  // namespace

void PlanPreflight(const LaunchOptions& o, const std::string& hostname, LaunchPlan* plan) {
  const PreflightMode mode =
      o.preflight.value_or(o.max_nodes > 1 ? PreflightMode::kQuick : PreflightMode::kOff);
  if (!o.log_dir.empty()) plan->bad_nodes_files.push_back(o.log_dir + "/bad_nodes.tsv");
  plan->bad_nodes_files.push_back(BadNodesPath());
  plan->agent.bad_nodes_files = plan->bad_nodes_files;
  if (mode == PreflightMode::kOff) return;
  PreflightAsk ask;
  ask.mode = mode;
  ask.gpus_needed = GpusNeeded(o, plan->nproc);
  ask.checkpoint_dir = CheckpointDirOf(o.command, o.log_dir.empty() ? "." : o.log_dir);
  plan->preflight = [ask, hostname, files = plan->bad_nodes_files]() -> absl::StatusOr<double> {
    const auto start = std::chrono::steady_clock::now();
    const auto nvml = Nvml::Load();
    const PreflightReport r = RunPreflight(ask, nvml.get());
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (const std::string failures = r.Failures(); !failures.empty()) {
      RecordBadNode(PosixFileSystem(), files,
                    {hostname, std::time(nullptr), absl::StrCat("preflight: ", failures)});
      return absl::FailedPreconditionError(absl::StrCat(
          "the preflight failed on this node (", hostname, "): ", failures,
          "; recorded in the bad-node list (dlrun bad-nodes; --preflight off skips the checks)"));
    }
    spdlog::info("preflight ({}): {}", PreflightModeName(ask.mode), Summary(r, took));
    return r.gflops;
  };
}

int PreflightMain(const std::vector<std::string>& args) {
  auto a = ParsePreflightArgs(args);
  if (!a.ok()) return Fail(a.status());
  if (a->help) return Print(PreflightUsage());
  const auto nvml = Nvml::Load();
  PreflightAsk ask{a->mode, a->gpus, a->checkpoint_dir};
  const PreflightReport r = RunPreflight(ask, nvml.get());
  for (const PreflightCheck& c : r.checks) {
    std::printf("%-8s %-4s %s\n", c.name.c_str(), c.ok ? "ok" : "FAIL", c.detail.c_str());
  }
  const std::string failures = r.Failures();
  if (failures.empty()) return 0;
  if (a->record) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    RecordBadNode(PosixFileSystem(), {BadNodesPath()},
                  {host, std::time(nullptr), absl::StrCat("preflight: ", failures)});
  }
  return 1;
}

int BadNodesMain(const std::vector<std::string>& args) {
  auto a = ParseBadNodesArgs(args);
  if (!a.ok()) return Fail(a.status());
  if (a->help) return Print(BadNodesUsage());
  const std::string path = BadNodesPath();
  if (path.empty()) return FailRun(absl::FailedPreconditionError("neither HOME nor "
                                                                 "XDG_CACHE_HOME is set: no "
                                                                 "bad-node list"));
  if (!a->add.empty()) {
    const BadNode bad{a->add, static_cast<int64_t>(std::time(nullptr)), a->reason};
    if (absl::Status s = AddBadNode(PosixFileSystem(), path, bad); !s.ok()) return FailRun(s);
    return 0;
  }
  if (a->clear) {
    auto n = ClearBadNodes(PosixFileSystem(), path, a->command);
    if (!n.ok()) return FailRun(n.status());
    std::printf("cleared %d node(s) from %s\n", *n, path.c_str());
    return 0;
  }
  const auto nodes = ReadBadNodes(PosixFileSystem(), path);
  if (nodes.empty()) {
    std::printf("no bad nodes (%s)\n", path.c_str());
    return 0;
  }
  for (const BadNode& n : nodes) {
    std::printf("%s  since %s  %s\n", n.host.c_str(), FormatSince(n.since).c_str(),
                n.reason.c_str());
  }
  return 0;
}

}  // namespace dlrun::launcher
