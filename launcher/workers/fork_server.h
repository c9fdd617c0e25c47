// A Python program's ready processes on this node: one interpreter, started by the agent with
// the program's own command (the warm spare's bootstrap, launcher/app/spare_bootstrap.py, told
// to serve), imports torch once and forks every worker, warm spare and replacement of the
// program from there: copy-on-write, milliseconds, at any load, and no import paid twice
// (docs/RECOVERY.md, "Ready processes"). A middle process forks each one and exits, so the
// worker is the agent's child (the agent makes itself a subreaper first) and is reaped, signalled
// and timed like any other.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/workers/clock.h"

namespace dlrun::launcher {

// In a process the agent just forked (async-signal-safe calls only): its own process group (the
// agent signals everything it starts), death with the agent even on SIGKILL (it _exits when the
// agent is already gone), the signals the agent blocks for its signalfd unblocked, SIGPIPE back
// to its default (the agent ignores it; an ignored signal would survive exec).
void EnterChildOfAgent(pid_t agent_pid);

class ForkServer {
 public:
  // Starts `argv` with `env` (KEY=VALUE entries; a worker's own fds left out) in its own process
  // group, its stdout and stderr the agent's stderr; null when it cannot be started (no subreaper,
  // no socket, no fork).
  static std::unique_ptr<ForkServer> Start(const std::vector<std::string>& argv,
                                           const std::vector<std::string>& env);
  ~ForkServer();  // closes the socket: the server exits (its forks are the agent's)

  pid_t pid() const { return pid_; }
  const std::vector<std::string>& argv() const { return argv_; }
  bool ready() const { return state_ == State::kReady; }
  bool gone() const { return state_ == State::kGone; }
  // Until it has done its imports (true), or it exited, `deadline` passed or `interrupt_fd`
  // became readable (a signal for the agent: false, and the caller starts cold). `beat`, when
  // set, is called every `every` meanwhile: the agent's heartbeat to its rendezvous, which
  // declares a node silent for 5 s dead, where torch's import can take longer (a loaded node, a
  // venv on a network file system).
  bool AwaitReady(SteadyTime deadline, int interrupt_fd, const std::function<void()>& beat = {},
                  Millis every = Millis(1000));
  // Its process exited (the agent reaped it): no more forks.
  void Exited() { state_ = State::kGone; }

  struct Request {
    bool spare = false;            // waits for its environment on its last fd (contract::kSpareFd)
    std::vector<std::string> env;  // KEY=VALUE: the worker's whole environment
    std::vector<std::pair<int, int>> fds;  // (the agent's fd, the number it has in the worker)
    std::vector<int> cpus;                 // pinned to these; empty: as the server
  };
  // A worker's request: its stdout and stderr, its heartbeat and control pipes (at the numbers
  // the environment names), a spare's environment pipe (-1: not a spare) last.
  static Request WorkerRequest(int out, int err, int heartbeat, int control, int spare,
                               std::vector<std::string> env, std::vector<int> cpus);
  // The pid of the process forked for `r` (in its own process group), within a bound.
  absl::StatusOr<pid_t> Fork(const Request& r);

 private:
  ForkServer(pid_t pid, int sock, std::vector<std::string> argv)
      : pid_(pid), sock_(sock), argv_(std::move(argv)) {}
  pid_t pid_;
  int sock_;
  std::vector<std::string> argv_;
  // Importing until it says "ready"; gone once it exited, failed, or stopped answering.
  enum class State { kImporting, kReady, kGone } state_ = State::kImporting;
};

}  // namespace dlrun::launcher
