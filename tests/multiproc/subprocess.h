// Runs a command with a deadline and captures its output, for the multi-process tests.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"  // MakeTempDir

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

// A command started in the background, its output on a pipe.
struct Started {
  int pid = -1;
  int out_fd = -1;
  std::string output;  // what ReadUntil / FinishCommand have read so far
  bool timed_out = false;
};
Started StartCommand(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env = {});
// Reads output until `needle` has appeared `count` times or the deadline passes; returns
// whether it did.
bool ReadUntil(Started& s, const std::string& needle, int count, std::chrono::milliseconds deadline);
// Reads the rest of the output and reaps the process (SIGKILLs its group at the deadline).
// Returns the exit code (128+N for signal N).
int FinishCommand(Started& s, std::chrono::milliseconds deadline);
// Waits for any process (not only a child) to exit, through a pidfd. False at the deadline.
bool WaitForExit(int pid, std::chrono::milliseconds deadline);
// A free TCP port on 127.0.0.1, below the kernel's ephemeral range and locked against other
// test processes until this one exits (subprocess.cc says why).
int FreeTcpPort();

// How many times `needle` occurs in `hay` (overlaps counted).
size_t Count(const std::string& hay, const std::string& needle);

std::string ReadFile(const std::string& path);

}  // namespace dlrun::testing
