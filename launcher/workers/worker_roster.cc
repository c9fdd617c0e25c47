#include "launcher/workers/worker_roster.h"

#include <algorithm>

namespace dlrun::launcher {

std::vector<DumpTarget> DumpTargets(const std::vector<GroupWorker>& workers, bool live_only) {
  std::vector<DumpTarget> targets;
  for (const GroupWorker& w : workers) {
    if (w.alive || !live_only) targets.push_back({w.rank, w.local_rank, w.pid});
  }
  return targets;
}

std::vector<int> RanksOf(const std::vector<GroupWorker>& workers) {
  std::vector<int> ranks;
  for (const GroupWorker& w : workers) ranks.push_back(w.rank);
  return ranks;
}

std::vector<pid_t> PidsOf(const std::vector<GroupWorker>& workers) {
  std::vector<pid_t> pids;
  for (const GroupWorker& w : workers) pids.push_back(w.pid);
  return pids;
}

int AliveCount(const std::vector<GroupWorker>& workers) {
  return static_cast<int>(
      std::count_if(workers.begin(), workers.end(), [](const GroupWorker& w) { return w.alive; }));
}

bool AllDeclared(const std::vector<GroupWorker>& workers) {
  return !workers.empty() && std::all_of(workers.begin(), workers.end(),
                                         [](const GroupWorker& w) { return w.recoverable; });
}

}  // namespace dlrun::launcher
