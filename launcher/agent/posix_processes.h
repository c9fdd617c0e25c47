// The agent's processes on Linux: fork/exec into a process group per worker, stdout/stderr
// through pipes into LineStreams, a heartbeat pipe per worker (contract::kHeartbeatFd), signals
// (SIGCHLD and the handled ones) through a signalfd, wake-ups through an eventfd.
#pragma once

#include <memory>
#include <vector>

#include "launcher/agent/output.h"
#include "launcher/agent/processes.h"

namespace dlrun::launcher {

// Blocks SIGCHLD and `handled` in the calling thread; call it before any thread is started
// (threads inherit the mask, so these signals can only be read from the agent's signalfd).
void BlockAgentSignals(const std::vector<int>& handled);

class PosixProcesses final : public Processes {
 public:
  // `handled`: the signals (besides SIGCHLD) that Wait() reports as kSignal events.
  static absl::StatusOr<std::unique_ptr<PosixProcesses>> Create(const std::vector<int>& handled);
  ~PosixProcesses() override;

  absl::StatusOr<pid_t> Spawn(const SpawnSpec& spec) override;
  void SignalGroup(pid_t pid, int sig) override;
  std::vector<ProcEvent> Wait(SteadyTime deadline) override;
  void Wake() override;
  void CloseOutputs() override;

 private:
  struct Child {
    pid_t pid = -1;
    int out_fd = -1, err_fd = -1, heartbeat_fd = -1;
    std::unique_ptr<LineStream> out, err;
  };
  PosixProcesses(int signal_fd, int wake_fd) : signal_fd_(signal_fd), wake_fd_(wake_fd) {}
  void Drain(int* fd, LineStream* s);
  void ReadSignals(std::vector<ProcEvent>* events);
  void Reap(std::vector<ProcEvent>* events);

  int signal_fd_;
  int wake_fd_;
  std::vector<Child> children_;
};

}  // namespace dlrun::launcher
