// The one way the launcher starts a helper tool (py-spy, eu-stack, perf, nsys's stub...):
// posix_spawn with stdin on /dev/null, a clean signal mask and default dispositions (the agent
// blocks the signals it reads from its signalfd; a tool must not inherit that).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::launcher {

struct ToolSpawn {
  std::vector<std::string> argv;  // argv[0] is a path
  // fd 1 and fd 2: an open descriptor (dup'ed), else a file appended to (empty: /dev/null).
  int stdout_fd = -1, stderr_fd = -1;
  std::string stdout_path, stderr_path;
  int fd3 = -1;             // dup'ed to fd 3 (e.g. an exit pipe's write end), if >= 0
  bool own_group = false;   // its own process group
};

// The tool's pid, or "cannot run ARGV0: REASON".
absl::StatusOr<pid_t> SpawnTool(const ToolSpawn& s);

}  // namespace dlrun::launcher
