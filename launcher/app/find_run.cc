#include "launcher/app/find_run.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/app/run_location.h"
#include "launcher/cli/options.h"
#include "launcher/cli/job_token.h"
#include "launcher/rdzv/rdzv_loader.h"
#include "rendezvous/tls.h"

namespace dlrun::launcher {
namespace {

// The runs to choose from: the one named by `log_dir` (a run directory, or the directory that
// holds the runs), else every live one registered on this machine.
absl::StatusOr<std::vector<FoundRun>> Candidates(const std::string& log_dir,
                                                 const std::string& run_id,
                                                 const std::string& index) {
  std::vector<std::string> dirs;
  if (!log_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(log_dir, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid value '", log_dir, "' for --log-dir: expected a directory"));
    }
    if (std::filesystem::exists(std::filesystem::path(log_dir) / kWorkersFileName, ec)) {
      dirs.push_back(log_dir);
    } else {
      for (auto it = std::filesystem::directory_iterator(log_dir, ec);
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
    if (!run_id.empty() && w->run_id != run_id) continue;
    out.push_back({d, *std::move(w)});
  }
  return out;
}

}  // namespace

absl::StatusOr<FoundRun> FindRun(const std::string& log_dir, const std::string& run_id) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string index = RunIndexDir(tmp ? tmp : "/tmp", getuid());
  auto runs = Candidates(log_dir, run_id, index);
  if (!runs.ok()) return runs.status();
  const std::string where = log_dir.empty() ? absl::StrCat("registered in ", index)
                                            : absl::StrCat("in --log-dir ", log_dir);
  if (runs->empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no running dlrun job", run_id.empty() ? "" : " with run id '" + run_id + "'",
        " on this node (none ", where, "): start one, or give the --log-dir of a running job"));
  }
  if (runs->size() > 1) {
    // Jobs that share a run id (torchrun's default --rdzv-id "none" of a static job, as pods
    // set up by hand have) are told apart by their run directories alone.
    std::vector<std::string> names;
    std::set<std::string> ids;
    for (const FoundRun& r : *runs) {
      names.push_back(absl::StrCat(r.workers.run_id, " (agent pid ", r.workers.agent_pid,
                                   ", --log-dir ", r.run_dir, ")"));
      ids.insert(r.workers.run_id);
    }
    const bool shared_id = ids.size() < runs->size();
    return absl::FailedPreconditionError(absl::StrCat(
        runs->size(), " dlrun jobs run on this node (", absl::StrJoin(names, ", "),
        "): pick one with ",
        shared_id ? "--log-dir (their run ids are the same: --rdzv-id names a job when it starts)"
                  : "--run-id or --log-dir"));
  }
  return std::move(runs->front());
}

absl::StatusOr<JobTarget> ChooseJob(const JobChoice& c) {
  JobTarget t;
  if (!c.rdzv_endpoint.empty()) {  // a job elsewhere
    if (c.run_id.empty()) {
      return absl::InvalidArgumentError("--rdzv-endpoint needs the job's --rdzv-id");
    }
    auto token = JobToken(ProcessEnv(), c.run_id);
    if (!token.ok()) return token.status();
    t.endpoint = c.rdzv_endpoint;
    t.run_id = c.run_id;
    t.token = *std::move(token);
    return t;
  }
  auto run = FindRun(c.log_dir, c.run_id);
  if (!run.ok()) return run.status();
  const WorkersFile& w = run->workers;
  if (!w.rdzv_endpoint.empty() && !c.this_node) {
    t.endpoint = w.rdzv_endpoint;
    t.run_id = w.run_id;
    t.token = w.rdzv_token;
  }
  t.run = *std::move(run);
  return t;
}

absl::StatusOr<std::unique_ptr<rdzv::RendezvousClient>> JobClient(const std::string& endpoint,
                                                                   const std::string& run_id,
                                                                   const std::string& token) {
  auto api = LoadRendezvous();
  if (!api.ok()) return api.status();
  auto tls = rdzv::TlsConfigFromEnv();
  if (!tls.ok()) return tls.status();
  rdzv::ClientOptions co;
  co.endpoint = endpoint;
  co.run_id = run_id;
  co.token = token;
  co.tls = *std::move(tls);
  return (*api)->CreateClient(co);
}

}  // namespace dlrun::launcher
