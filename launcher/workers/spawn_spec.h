// How one worker of an attempt is started: its command (a profiler's wrapper included), the
// torchrun environment, its CPUs and GPU, where its output goes, its error file and the Flight
// Recorder's settings. Pure but for making the attempt's directories (RunDir).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/assignment.h"
#include "launcher/workers/agent_options.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/processes.h"
#include "launcher/workers/run_dir.h"

namespace dlrun::launcher {

// The console prefix of a worker's lines: "[rank N]: " or --log-line-prefix-template's.
std::string ConsolePrefix(const AgentOptions& options, const Assignment& current, int rank,
                          int local_rank);

// `spare_argv`: the warm spares' command now (WorkerGroup::spare_argv()).
SpawnSpec MakeSpawnSpec(const AgentOptions& options, const std::vector<std::string>& spare_argv,
                        const Assignment& current, const RunDir& run_dir, int attempt,
                        int local_rank);

// When a restarted group's phases ended (bench/recovery reads them from the table's header).
struct RestartPhases {
  std::optional<SteadyTime> fault_seen, stopped;  // both set after a fault
  SteadyTime assigned, spawned;
};
// The log's group table: "restart R: node N of M, world size W, master A:P, run id ID" (with the
// restart's phases after a fault), then one "local_rank rank pid" row per worker.
std::string GroupTable(const Assignment& a, const std::vector<DumpTarget>& workers,
                       const RestartPhases& phases);

}  // namespace dlrun::launcher
