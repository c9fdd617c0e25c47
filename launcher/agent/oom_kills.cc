// The memory cgroup's OOM kill count (posix_processes.h: OomKillFiles, ReadOomKillCount).
#include <fstream>
#include <string>
#include <vector>

#include "common/files.h"
#include "launcher/agent/posix_processes.h"

namespace dlrun::launcher {

std::vector<std::string> OomKillFiles(const std::string& proc_self_cgroup,
                                      const std::string& root) {
  // v2: "0::/PATH" -> ROOT/PATH/memory.events; v1: "N:memory:/PATH" (or a list with memory)
  // -> ROOT/memory/PATH/memory.oom_control. Both carry a line "oom_kill N".
  std::vector<std::string> files;
  for (const CgroupEntry& e : ParseProcCgroup(proc_self_cgroup)) {
    if (e.v2()) {
      files.push_back(root + e.path + "/memory.events");
    } else if (e.Has("memory")) {
      files.insert(files.begin(), root + "/memory" + e.path + "/memory.oom_control");
    }
  }
  return files;
}

int64_t ReadOomKillCount(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    std::ifstream in(f);
    for (std::string key; in >> key;) {
      int64_t n = 0;
      if (!(in >> n)) break;
      if (key == "oom_kill") return n;
    }
  }
  return -1;
}

int64_t ReadOomKills(const std::string& proc_self_cgroup, const std::string& root) {
  return ReadOomKillCount(OomKillFiles(proc_self_cgroup, root));
}

}  // namespace dlrun::launcher
