// Where a run lives: its directory made (the agent's RunDir, launcher/workers/run_dir.h, then
// holds every file in it) and this machine's index of runs for `dlrun stacks`.
// The directory: where a run's worker error files and logs go. With --log-dir
// (or -r/-t without it): torchrun's DIR/<run_id>_<random>/, created here and kept. Else a
// scratch directory, which the agent removes after the run unless a failed run left error
// files in it (AgentOptions::keep_run_dir).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "launcher/cli/options.h"

namespace dlrun::launcher {

// The run directory for `run_id`; `keep` says whether it is a kept log directory.
absl::StatusOr<std::string> MakeRunDir(const LaunchOptions& o, const std::string& run_id,
                                       const std::string& hostname, const EnvLookup& env,
                                       bool* keep);

// The scratch directory: TMPDIR/dlrun-UID/RUNID-PID.
std::string ScratchRunDir(const std::string& tmpdir, unsigned uid, const std::string& run_id, int pid);

// The mkdtemp template of a run's log directory: torchrun's DIR/<run_id>_<random>, with the
// host name before the random part in multi-node jobs (their nodes may share DIR).
std::string RunLogDirTemplate(const std::string& log_dir, const std::string& run_id,
                              const std::string& hostname, bool multinode);

// The index of the runs on this machine, for `dlrun stacks`: TMPDIR/dlrun-UID/jobs/AGENT_PID, a
// symbolic link to the agent's run directory (whose workers.json names the workers). A link
// whose agent is gone is ignored, and removed by the next registration.
std::string RunIndexDir(const std::string& tmpdir, unsigned uid);
void RegisterRun(const std::string& index_dir, int agent_pid, const std::string& run_dir);
void UnregisterRun(const std::string& index_dir, int agent_pid);
struct LiveRun {
  int agent_pid = -1;
  std::string run_dir;
};
std::vector<LiveRun> LiveRuns(const std::string& index_dir);

}  // namespace dlrun::launcher
