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

}  // namespace dlrun
