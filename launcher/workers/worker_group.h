// This node's worker group (agent.h): which process runs which local and global rank in the
// current attempt, what ended, and the signals to them. It reaches the processes only through
// Processes and writes only through the RunDir; the agent's loop decides when.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/assignment.h"
#include "launcher/stacks/stacks.h"
#include "launcher/workers/agent_options.h"
#include "launcher/workers/job_channel.h"
#include "launcher/workers/processes.h"
#include "launcher/workers/root_cause.h"
#include "launcher/workers/run_dir.h"
#include "launcher/workers/worker_roster.h"

namespace dlrun::launcher {

class WorkerGroup {
 public:
  using Worker = GroupWorker;  // worker_roster.h: the views of workers()

  WorkerGroup(const AgentOptions& options, Processes& processes, RunDir& run_dir)
      : options_(options),
        processes_(processes),
        run_dir_(run_dir),
        spare_argv_(options.spare_argv) {}

  // Starts every local rank of `current` in `attempt`; with current.recovery_generation > 0
  // (a node admitted into a running group) each as a replacement of that generation.
  absl::Status Start(const Assignment& current, int attempt);
  // Starts each of `lost` again (a warm spare when there is one) in generation `generation` of
  // `next`; false when one cannot be started. `replaced`: "local rank N as pid P" each.
  bool Replace(const std::vector<WorkerExit>& lost, const Assignment& next, int generation,
               std::vector<std::string>* replaced);
  // The exit of `pid` (`wall_s`: when), noted in exits(); nullopt for no live worker of the
  // group. A death by a signal dlrun passed on is said once, with what to do.
  std::optional<WorkerExit> Exited(pid_t pid, int exit_code, int signal, double wall_s);
  // A worker declared in-process recovery: its local rank, or -1 for no live worker.
  int Declared(pid_t pid);
  // A worker said its work is done: a death by a signal after it is a finish, with a warning.
  void Done(pid_t pid);
  bool IsPassthrough(int sig) const;
  // Passes `sig` (SIGUSR1, SIGUSR2: the job goes on) to every live worker.
  void PassOn(int sig);
  // The start of a stop: `first_signal` to every live worker (SIGTERM to one that ignores it),
  // SIGCONT to a stopped one. Kill(): SIGKILL to every worker's group, naming the ones alive.
  void Signal(int first_signal);
  void Kill();
  void NameStuck() const;  // the ones still there after SIGKILL
  void set_stopping(bool s) { stopping_ = s; }
  bool stopping() const { return stopping_; }
  // The failed workers' exits are history once they are replaced.
  void DropFailedExits();
  // The exits of the attempt so far; cleared with each attempt.
  const std::vector<WorkerExit>& exits() const { return exits_; }
  // The group moved to `next` (a recovery): each worker's global rank follows.
  void MoveTo(const Assignment& next);
  std::vector<int> StoppedRanks() const;
  // Whether the memory cgroup's OOM killer ended a worker since the group started.
  bool OomKilled() const;
  // RUN_DIR/workers.json for `dlrun stacks`: the group, the rendezvous' address.
  void WriteWorkersFile(const JobChannel::RdzvAddress& rdzv) const;
  const Assignment& current() const { return current_; }
  int attempt() const { return attempt_; }
  const std::vector<Worker>& workers() const { return workers_; }
  // The warm spares' command: options.spare_argv at first, set at run time by a declaration of
  // in-process recovery (InProcessRecovery); every spawn after it promotes and replaces a spare.
  std::vector<std::string>& spare_argv() { return spare_argv_; }

 private:
  const AgentOptions& options_;
  Processes& processes_;
  RunDir& run_dir_;
  std::vector<std::string> spare_argv_;
  Assignment current_;
  int attempt_ = 0;
  std::vector<Worker> workers_;
  std::vector<WorkerExit> exits_;
  bool stopping_ = false;
  bool passthrough_hint_given_ = false;  // the advice after a death by a passed-on signal, once
  int64_t oom_kills_at_spawn_ = -1;      // ProcessFacts::OomKills() when the group started

  // The live worker `pid`, or nullptr.
  Worker* Live(pid_t pid);
};

}  // namespace dlrun::launcher
