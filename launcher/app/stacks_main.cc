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
#include "launcher/app/run_dir.h"
#include "launcher/cli/flags.h"
#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {
namespace {

struct StacksArgs {
  bool json = false;
  std::string log_dir;
  std::string run_id;
  std::chrono::milliseconds timeout{5000};
};

std::vector<cli::Flag<StacksArgs>> Flags() {
  return {
      {"json", "", false, cli::BoolField(&StacksArgs::json),
       "print the groups, suspects and missing ranks as JSON"},
      {"log-dir", "", true, cli::StrField(&StacksArgs::log_dir),
       "the job's run directory, or the --log-dir it was started with"},
      {"run-id", "", true, cli::StrField(&StacksArgs::run_id),
       "the job's run id (--rdzv-id), when several jobs run on this node"},
      {"timeout", "", true, cli::DurationField("timeout", &StacksArgs::timeout, false),
       "seconds to wait for the dumps (default 5); a rank not read by then is listed as missing"},
  };
}

std::string StacksUsage() {
  return cli::Usage(
      "usage: dlrun stacks [options]\n"
      "The current stacks of every worker of a running dlrun job on this node: ranks with the\n"
      "same stack share one entry, and the ranks whose stack differs are the suspects. Python\n"
      "workers are read with py-spy, native ones with eu-stack (docs/STACKS.md).\n",
      Flags());
}

struct FoundRun {
  std::string run_dir;
  WorkersFile workers;
};

// The runs to choose from: the one named by --log-dir (a run directory, or the directory that
// holds the runs), else every live one registered on this machine.
absl::StatusOr<std::vector<FoundRun>> Candidates(const StacksArgs& a, const std::string& index) {
  std::vector<std::string> dirs;
  if (!a.log_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(a.log_dir, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid value '", a.log_dir, "' for --log-dir: expected a directory"));
    }
    if (std::filesystem::exists(std::filesystem::path(a.log_dir) / kWorkersFileName, ec)) {
      dirs.push_back(a.log_dir);
    } else {
      for (auto it = std::filesystem::directory_iterator(a.log_dir, ec);
           !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
        if (std::filesystem::exists(it->path() / kWorkersFileName)) dirs.push_back(it->path());
      }
    }
  } else {
    for (const LiveRun& r : LiveRuns(index)) dirs.push_back(r.run_dir);
  }
  std::vector<FoundRun> out;
  for (const std::string& d : dirs) {
    auto w = ReadWorkersFile(absl::StrCat(d, "/", kWorkersFileName));
    if (!w.ok()) continue;
    if (w->agent_pid <= 0 || (kill(w->agent_pid, 0) != 0 && errno != EPERM)) continue;  // over
    if (!a.run_id.empty() && w->run_id != a.run_id) continue;
    out.push_back({d, *std::move(w)});
  }
  return out;
}

}  // namespace

int StacksMain(const std::vector<std::string>& args) {
  StacksArgs a;
  auto parsed = cli::ParseFlags(cli::ParseSpec{"dlrun stacks", /*wants_program=*/false}, Flags(),
                                args, a);
  if (!parsed.ok()) return Fail(parsed.status());
  if (parsed->help) return Print(StacksUsage());
  if (parsed->version) return Print(cli::VersionText());
  const char* tmp = std::getenv("TMPDIR");
  const std::string index = RunIndexDir(tmp ? tmp : "/tmp", getuid());
  auto runs = Candidates(a, index);
  if (!runs.ok()) return Fail(runs.status());
  const std::string where = a.log_dir.empty() ? absl::StrCat("registered in ", index)
                                              : absl::StrCat("in --log-dir ", a.log_dir);
  if (runs->empty()) {
    return FailRun(absl::NotFoundError(absl::StrCat(
        "no running dlrun job", a.run_id.empty() ? "" : " with run id '" + a.run_id + "'",
        " on this node (none ", where, "): start one, or give the --log-dir of a running job")));
  }
  if (runs->size() > 1) {
    std::vector<std::string> names;
    for (const FoundRun& r : *runs) {
      names.push_back(absl::StrCat(r.workers.run_id, " (agent pid ", r.workers.agent_pid, ")"));
    }
    return FailRun(absl::FailedPreconditionError(
        absl::StrCat(runs->size(), " dlrun jobs run on this node (", absl::StrJoin(names, ", "),
                     "): pick one with --run-id or --log-dir")));
  }
  const WorkersFile& w = runs->front().workers;
  const auto t0 = std::chrono::steady_clock::now();
  StackReport report = GroupStacks(DumpStacks(w.workers, FindStackTools(), w.host, a.timeout));
  report.took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    Print(StackReportJson(report, 2) + "\n");
  } else {
    Print(FormatStackReport(report));
  }
  return report.groups.empty() ? 1 : 0;
}

}  // namespace dlrun::launcher
