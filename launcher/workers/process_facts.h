// What the kernel says about the agent's workers, read from /proc and the cgroup tree: how a
// worker handles a signal, whether it is stopped, how many OOM kills its memory cgroup counted.
// Nothing here changes a process (Processes starts, signals and waits on them); the agent asks
// through Processes::facts(), and in-process tests answer with a fake.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dlrun::launcher {

// The user and system CPU seconds of `usage` (getrusage's, or wait4's for a reaped child: with
// the children it reaped itself).
double CpuSeconds(const rusage& usage);

class ProcessFacts {
 public:
  virtual ~ProcessFacts() = default;
  // What the worker `pid` does on `sig`, as the kernel says (/proc/PID/status). The agent stops a
  // worker that ignores SIGINT (inherited from a shell's `dlrun ... &`) with SIGTERM instead of
  // waiting out the grace period, and warns when a passed-on SIGUSR1 meets no handler.
  enum class SignalAction { kDefault, kIgnored, kCaught, kUnknown };
  virtual SignalAction Disposition(pid_t pid, int sig) const { return SignalAction::kUnknown; }
  // Whether the worker `pid` is stopped by a signal (SIGSTOP, SIGTSTP; /proc/PID/stat's state
  // T): hang detection names such a rank the culprit.
  virtual bool Stopped(pid_t pid) const { return false; }
  // Where the worker `pid`'s main thread is, as /proc/PID/syscall says: the number of the system
  // call it is blocked in and its arguments, "running", or "" when it cannot be read. Hang
  // detection tells a rank waiting on its communication threads (a futex wait) from one blocked
  // in its own work when no stack could be read (HoldersBySyscall, stacks.h).
  virtual std::string BlockedCall(pid_t pid) const { return ""; }
  // The OOM kills the kernel counted so far in the memory cgroup the agent and its workers run
  // in (v2 memory.events, v1 memory.oom_control); -1 when it cannot be read.
  virtual int64_t OomKills() const { return -1; }
};

// The answers of this machine's /proc and /sys/fs/cgroup.
class ProcFsFacts final : public ProcessFacts {
 public:
  // Finds where the agent's memory cgroup counts OOM kills (once; read at each group's start
  // and end).
  ProcFsFacts();
  SignalAction Disposition(pid_t pid, int sig) const override;
  bool Stopped(pid_t pid) const override;
  std::string BlockedCall(pid_t pid) const override;
  int64_t OomKills() const override;

 private:
  std::vector<std::string> oom_kill_files_;  // OomKillFiles() of this process' cgroups
};

// The files that may count the OOM kills of the memory cgroup named in `proc_self_cgroup`
// (/proc/self/cgroup's text) under `root` (/sys/fs/cgroup; tests pass a fake tree): v1's
// memory.oom_control first, then v2's memory.events.
std::vector<std::string> OomKillFiles(const std::string& proc_self_cgroup, const std::string& root);
// The "oom_kill" count of the first of `files` that has one; -1 when none has.
int64_t ReadOomKillCount(const std::vector<std::string>& files);
// Both: the count for `proc_self_cgroup` under `root`.
int64_t ReadOomKills(const std::string& proc_self_cgroup, const std::string& root);

}  // namespace dlrun::launcher
