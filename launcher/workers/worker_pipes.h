// A worker's side of a start without the fork server: its pipes (stdout, or a pseudo-terminal
// sized as the agent's; stderr; the heartbeat records; the agent's words; a spare's
// environment), its environment (the agent's, with the worker's variables over it), and what
// runs in the child between fork and exec.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dlrun::launcher {

// Each pair as pipe2 gives it ([0] the read end); O_CLOEXEC, the heartbeat non-blocking.
struct WorkerPipes {
  int out[2] = {-1, -1};  // a pseudo-terminal when asked: [0] the agent's end
  int err[2] = {-1, -1};
  int heartbeat[2] = {-1, -1};  // step records, worker -> agent
  int control[2] = {-1, -1};    // the agent's words, agent -> worker
  int spare[2] = {-1, -1};      // a warm spare's environment, agent -> spare (when asked)
  absl::Status Open(bool pty, bool spare_fd);
};

// The agent's environment with `overrides` replacing or adding variables, as KEY=VALUE.
std::vector<std::string> MergedEnvironment(const std::map<std::string, std::string>& overrides);

// In the child, between fork and exec (async-signal-safe calls only): the pipes onto stdout and
// stderr, the heartbeat, control and spare fds kept across exec, the CPUs, then execvpe; on
// failure `failure` and the reason on stderr, and exit 127.
[[noreturn]] void ExecChild(pid_t agent_pid, int out_w, int err_w, int hb_w, int ctl_r, int spare_r,
                            const cpu_set_t* cpus, char** argv, char** envp,
                            const std::string& failure);

}  // namespace dlrun::launcher
