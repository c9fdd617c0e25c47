// Small file and cgroup helpers the launcher and the CPU allocation (common/cpus.h) share.
#pragma once

#include <string>
#include <vector>

namespace dlrun {

// The whole file (binary), or empty when it cannot be read: /proc and /sys files, reports.
std::string ReadWholeFile(const std::string& path);

// A cgroup path and each of its ancestors up to the root: "/a/b" -> {"/a/b", "/a", "/"}.
// Limits (memory.max, cpu.max) bind from any level, so readers take the tightest.
std::vector<std::string> CgroupAncestry(std::string path);

// The lines of /proc/<pid>/cgroup, "ID:CONTROLLERS:PATH": cgroup v2's is "0::PATH" (no
// controllers), v1 has one per hierarchy ("4:cpu,cpuacct:PATH"). The one reader of it.
struct CgroupEntry {
  std::vector<std::string> controllers;  // empty: the v2 hierarchy
  std::string path;
  bool v2() const { return controllers.empty(); }
  bool Has(const std::string& controller) const;
};
std::vector<CgroupEntry> ParseProcCgroup(const std::string& text);

}  // namespace dlrun
