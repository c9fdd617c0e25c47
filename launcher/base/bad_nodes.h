// Bad nodes remembered (docs/USAGE.md "Preflight and bad nodes"): nodes the preflight left out,
// or whose workers failed twice with a hardware class, with the reason and the time. One list
// per user (BadNodesPath: under ~/.cache/dlrun, on the shared home of most clusters) and a copy
// beside the job's logs; `dlrun slurm` excludes them, `dlrun runai` keeps pods off them, and
// `dlrun bad-nodes` lists and clears them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/base/file_system.h"

namespace dlrun::launcher {

struct BadNode {
  std::string host;
  int64_t since = 0;  // seconds since the epoch
  std::string reason;
};

// $XDG_CACHE_HOME/dlrun/bad_nodes.tsv, else $HOME/.cache/dlrun/bad_nodes.tsv; empty when
// neither is set.
std::string BadNodesPath();

// The list in `path` (lines "HOST<TAB>SINCE<TAB>REASON"; malformed lines are skipped), in file
// order; empty when the file does not exist.
std::vector<BadNode> ReadBadNodes(const FileSystem& fs, const std::string& path);
// Adds `node` (a host already listed gets the new time and reason), replacing the file
// atomically.
absl::Status AddBadNode(FileSystem& fs, const std::string& path, const BadNode& node);
// AddBadNode to each of `paths` (empty ones skipped), with a warning for each that fails.
void RecordBadNode(FileSystem& fs, const std::vector<std::string>& paths, const BadNode& node);
// Removes `hosts` (all when empty); returns how many were removed.
absl::StatusOr<int> ClearBadNodes(FileSystem& fs, const std::string& path,
                                  const std::vector<std::string>& hosts);

// The hosts, comma-separated (sbatch --exclude's form).
std::string BadNodeHosts(const std::vector<BadNode>& nodes);

}  // namespace dlrun::launcher
