// The workers of this node's group as the agent sees them (worker_group.h keeps the list and
// starts, replaces and signals them), and the views the agent's parts ask of the list: pure
// functions of it.
#pragma once

#include <sys/types.h>

#include <vector>

#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {

struct GroupWorker {
  int local_rank = 0;
  int rank = 0;  // global, in its attempt
  pid_t pid = -1;
  bool alive = false;
  bool recoverable = false;  // declared in-process recovery (a "C recovery" record)
  bool done = false;         // said its work is done (a "D done" record)
};

// The workers to read stacks of (`live_only`: those alive).
std::vector<DumpTarget> DumpTargets(const std::vector<GroupWorker>& workers, bool live_only);
std::vector<int> RanksOf(const std::vector<GroupWorker>& workers);  // their global ranks
std::vector<pid_t> PidsOf(const std::vector<GroupWorker>& workers);
int AliveCount(const std::vector<GroupWorker>& workers);
// Whether there are workers and every one declared in-process recovery.
bool AllDeclared(const std::vector<GroupWorker>& workers);

}  // namespace dlrun::launcher
