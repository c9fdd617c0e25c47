// What the supervision loop needs from the operating system, as one small interface: start a
// worker, signal its process group, and wait for what happens next (a worker exits, a worker
// heartbeats, a signal reaches the agent, or another thread wakes the loop). The POSIX
// implementation (posix_processes.h: fork/exec, pipes, signalfd, waitpid) also moves the
// workers' output; in-process tests use a fake process table on a fake clock.
#pragma once

#include <sys/types.h>
#include <cstdint>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/process_facts.h"
#include "launcher/workers/step_record.h"

namespace dlrun::launcher {

// Where one of a worker's streams goes: the console (prefixed by line) and/or a log file.
struct StreamRoute {
  int console_fd = -1;   // 1, 2, or -1: not shown
  std::string log_path;  // empty: no log file
};

struct SpawnSpec {
  int local_rank = 0;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // set on top of the agent's environment
  std::vector<int> cpus;                   // pin to these CPUs; empty: no pinning
  std::string console_prefix;              // "[rank N]: "
  bool stdout_pty = false;  // stdout on a pseudo-terminal (line-buffered, progress bars live)
  StreamRoute out, err;
  // Warm spares (docs/RECOVERY.md): when not empty, a spare for this local rank is started
  // `spare_after` after the worker (argv: this, env: the worker's plus contract::kSpareFd), and
  // the next Spawn of this local rank promotes it instead of starting a process: it gets the
  // new environment on its pipe. Without a live spare Spawn starts the worker cold.
  std::vector<std::string> spare_argv;
  Millis spare_after{2000};
  // A Python program's fork server (fork_server.h): when not empty, the node's one interpreter
  // that imported torch is started with this command (once), and workers and spares are forked
  // from it; without it (not started, not ready in time, gone) they start as above.
  std::vector<std::string> fork_server_argv;
};

struct ProcEvent {
  enum class Kind { kExited, kHeartbeat, kSignal, kWake, kStep, kBadRecord };
  Kind kind = Kind::kWake;
  pid_t pid = -1;     // kExited, kHeartbeat, kStep, kBadRecord
  int exit_code = 0;  // kExited, when signal == 0
  int signal = 0;     // kExited: the signal that ended it; kSignal: the signal the agent got
  StepRecord step;    // kStep: what the worker reported (step_record.h)
  // kExited: its CPU seconds with those of the children it reaped (a DataLoader's workers), from
  // wait4; -1 where unknown. The sampler's last read can be a period before the exit.
  double cpu_s = -1;
  // kExited: its resident memory at its peak (wait4's ru_maxrss: the largest of it and the
  // children it reaped), 0 where unknown; what the report has where /proc cannot be read.
  int64_t rss_peak_bytes = 0;
};

// How a worker's process came to be (the report's "start" of a restart or a recovery).
enum class StartKind { kUnknown, kForked, kSpare, kCold };

class Processes {
 public:
  virtual ~Processes() = default;
  // Starts a worker in its own process group (pid == pgid).
  virtual absl::StatusOr<pid_t> Spawn(const SpawnSpec& spec) = 0;
  virtual void SignalGroup(pid_t pid, int sig) = 0;
  // Writes `line` to the worker's control pipe (contract::kControlFd: the agent's words to a
  // worker that declared in-process recovery). False when it could not be written whole.
  virtual bool Tell(pid_t pid, const std::string& line) { return false; }
  // Starts a warm spare for spec.local_rank (spec.spare_argv) spec.spare_after from now, as
  // Spawn does for a spec with spare_argv: for a worker started without one.
  virtual void KeepSpare(const SpawnSpec& spec) {}
  // How the worker `pid` was started: forked from the fork server, a promoted warm spare, or
  // a process of its own (cold).
  virtual StartKind HowStarted(pid_t pid) const { return StartKind::kUnknown; }
  // The warm spares standing by now (their memory is reported beside the workers').
  virtual std::vector<pid_t> SparePids() const { return {}; }
  // Called about every `every` while a start waits long (the fork server's imports): the
  // agent's heartbeat, so that its rendezvous does not take the wait for a lost node.
  virtual void BeatWhileWaiting(std::function<void()> beat, Millis every) {}
  // What the kernel says about the workers (process_facts.h): how one handles a signal, whether
  // it is stopped, the cgroup's OOM kills. The base answers "unknown" to each.
  virtual const ProcessFacts& facts() const {
    static const ProcessFacts unknown;
    return unknown;
  }
  // Blocks until at least one event or `deadline` (time_point::max(): no deadline). An empty
  // result means the deadline passed.
  virtual std::vector<ProcEvent> Wait(SteadyTime deadline) = 0;
  // Thread-safe: the next Wait() returns a kWake event.
  virtual void Wake() = 0;
  // After the group is gone: drains what is left of the workers' output (bounded) and closes
  // their streams and log files. Warm spares stay.
  virtual void CloseOutputs() = 0;
  // The last bytes (LineStream::kTailBytes) a worker of the group CloseOutputs() just closed
  // wrote to stderr; empty when unknown.
  virtual std::string ErrorTail(pid_t pid) const { return ""; }
};

}  // namespace dlrun::launcher
