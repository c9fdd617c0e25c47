// The profiling the agent does for --profile (docs/PROFILING.md). The agent asks a RankProfiler
// how to start each rank (only the profiled ones change: nsys wraps the command line, torch and a
// step range add variables) and tells it when a profiled rank's worker starts, reports a step and
// ends; at the end of a group it collects the results for the report. The real one runs the
// tools (perf and py-spy attach to the worker's process, started and stopped at the step
// records); the agent's in-process tests use a recording fake.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/profile/profile.h"
#include "telemetry/telemetry.h"

namespace dlrun::launcher {

class RankProfiler {
 public:
  virtual ~RankProfiler() = default;
  virtual bool Wants(int rank) const = 0;
  // The ranks asked for (--profile-ranks): the agent warns about those the job does not have.
  virtual std::vector<int> Ranks() const { return {}; }
  // A profiled rank's command line and the variables it gets on top of the others'.
  virtual std::vector<std::string> Argv(int rank, const std::vector<std::string>& argv) const {
    return argv;
  }
  virtual std::map<std::string, std::string> Env(int rank) const { return {}; }
  virtual void Started(int rank, pid_t pid) = 0;
  virtual void Step(int rank, int64_t step) = 0;
  virtual void Exited(int rank) = 0;
  // Ends the captures still running, waits for the tools within `bound`, turns their output into
  // the rank's file (and flame graph), and returns every profiled rank seen so far.
  virtual std::vector<telemetry::RankProfile> Collect(std::chrono::milliseconds bound) = 0;
};

// The tool's executable for `spec` (the override variables, py-spy next to the
// workers' interpreter `python`, PATH), checked usable: a missing tool, or perf where the kernel
// allows no perf events, is an error in one line naming what to install or change. torch needs
// none (the Python helper runs it).
absl::StatusOr<std::string> FindProfileTool(const ProfileSpec& spec, const std::string& python);

// The RankProfiler that runs `tool` (FindProfileTool's) and writes into `dir` (RUN_DIR/profile).
std::unique_ptr<RankProfiler> MakeToolProfiler(ProfileSpec spec, std::string tool, std::string dir,
                                               std::string hostname);

}  // namespace dlrun::launcher
