// Runs a command with a deadline and captures its output, for the multi-process tests.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace dlrun::testing {

struct ProcResult {
  int exit_code = -1;  // 128+N when killed by signal N
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

// Starts `argv` with the current environment plus `env`, waits at most `deadline`, then SIGKILLs
// its process group. Output is read while it runs (no sleeps).
ProcResult RunCommand(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env = {},
                      std::chrono::milliseconds deadline = std::chrono::seconds(120));

// A fresh empty directory under the test's temp dir.
std::string MakeTempDir();

std::string ReadFile(const std::string& path);

}  // namespace dlrun::testing
