// The agent's processes on Linux: fork/exec into a process group per worker, stdout/stderr
// through pipes into LineStreams, a heartbeat pipe per worker (contract::kHeartbeatFd), signals
// (SIGCHLD and the handled ones) through a signalfd, wake-ups through an eventfd.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "launcher/workers/fork_server.h"
#include "launcher/workers/output.h"
#include "launcher/workers/process_facts.h"
#include "launcher/workers/processes.h"

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
  bool Tell(pid_t pid, const std::string& line) override;
  void KeepSpare(const SpawnSpec& spec) override;
  std::vector<pid_t> SparePids() const override {
    std::vector<pid_t> pids;
    for (const auto& [lr, s] : spares_) pids.push_back(s.proc.pid);
    if (fork_server_ && !fork_server_->gone()) pids.push_back(fork_server_->pid());
    return pids;
  }
  void BeatWhileWaiting(std::function<void()> beat, Millis every) override {
    beat_ = std::move(beat);
    beat_every_ = every;
  }
  std::vector<ProcEvent> Wait(SteadyTime deadline) override;
  void Wake() override;
  void CloseOutputs() override;
  std::string ErrorTail(pid_t pid) const override;
  const ProcessFacts& facts() const override { return facts_; }
  StartKind HowStarted(pid_t pid) const override {
    auto it = started_.find(pid);
    return it == started_.end() ? StartKind::kUnknown : it->second;
  }

 private:
  struct Child {
    pid_t pid = -1;
    int out_fd = -1, err_fd = -1, heartbeat_fd = -1;
    int control_fd = -1;  // the write end of its control pipe (contract::kControlFd)
    std::unique_ptr<LineStream> out, err;
    StepRecordReader records;
  };
  // A started process and the agent's ends of its pipes.
  struct Started {
    pid_t pid = -1;
    int out_fd = -1, err_fd = -1, heartbeat_fd = -1;
    int heartbeat_child_fd = -1;                 // the heartbeat pipe's fd number in the process
    int control_fd = -1, control_child_fd = -1;  // the control pipe: agent's end, process' fd
    int spare_fd = -1;                           // a spare: the write end of its environment pipe
    bool forked = false;                         // by the fork server
  };
  // A warm spare waiting for promotion, and what it must match to be promoted.
  struct Spare {
    Started proc;
    std::vector<std::string> argv;
    std::vector<int> cpus;
    bool pty = false;
  };
  struct PendingSpare {
    SpawnSpec spec;
    SteadyTime due;
  };
  PosixProcesses(int signal_fd, int wake_fd) : signal_fd_(signal_fd), wake_fd_(wake_fd) {}
  absl::StatusOr<Started> Start(const std::vector<std::string>& argv,
                                std::map<std::string, std::string> env,
                                const std::vector<int>& cpus, bool pty, bool spare,
                                const std::vector<std::string>& fork_server_argv);
  // Whether the fork server for `argv` is ready, started (`env`) and awaited at the first ask.
  bool ForkServerReady(const std::vector<std::string>& argv, const std::vector<std::string>& env);
  // When a spare for `spec` is due: at once from a ready fork server, else spec.spare_after.
  SteadyTime SpareDue(const SpawnSpec& spec) const;
  // Promotes the spare for spec.local_rank if it matches and is alive; else discards it.
  std::optional<Started> Promote(const SpawnSpec& spec);
  void StartDueSpares();
  void DiscardSpare(Spare* s);
  void Drain(int* fd, LineStream* s);
  // The heartbeat pipe's bytes: a heartbeat event, then its records.
  void ReadRecords(Child* c, std::vector<ProcEvent>* events);
  void ReadSignals(std::vector<ProcEvent>* events);
  void Reap(std::vector<ProcEvent>* events);

  int signal_fd_;
  int wake_fd_;
  std::vector<Child> children_;
  std::map<int, Spare> spares_;                 // by local rank
  std::map<int, PendingSpare> pending_spares_;  // by local rank
  std::map<pid_t, std::string> error_tails_;    // of the group CloseOutputs() closed last
  std::unique_ptr<ForkServer> fork_server_;     // started at the first spec that names one
  std::function<void()> beat_;                  // BeatWhileWaiting
  Millis beat_every_{1000};
  bool fork_server_tried_ = false;
  std::map<pid_t, StartKind> started_;  // the workers Spawn started, how
  ProcFsFacts facts_;
};

}  // namespace dlrun::launcher
