// The local agent: starts this node's workers, supervises them in one event loop, restarts the
// group on failure up to max_restarts, forwards signals and never leaves a worker behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "launcher/worker_env.h"

namespace dlrun::launcher {

struct AgentOptions {
  std::vector<std::string> argv;  // what each worker runs (python prefix already applied)
  int nproc = 1;
  NodeAssignment assignment;  // restart_count is filled in per attempt
  int max_restarts = 0;
  std::chrono::milliseconds grace{30000};
  std::vector<int> forwarded_signals;  // e.g. SIGTERM, SIGINT, SIGHUP, SIGQUIT
  int omp_threads = 0;                 // > 0: set OMP_NUM_THREADS for workers
  std::string run_dir;                 // per-run scratch dir for error files
  // Called before each attempt to pick the master port (standalone picks a fresh free port so a
  // restart never waits on a socket of the previous attempt). Empty: keep assignment's port.
  std::function<int()> pick_master_port;
};

// How one worker ended.
struct WorkerExit {
  int local_rank = -1;
  int global_rank = -1;
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, or 0
  double when_s = 0;  // wall clock seconds since the epoch
  bool failed() const { return signal != 0 || exit_code != 0; }
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  // Runs until the job ends; returns the exit code for dlrun: 0, the first failing worker's code
  // (128+N for a signal), or 128+N if dlrun itself got forwarded signal N.
  int Run();

 private:
  struct Worker {
    int local_rank;
    pid_t pid;
    bool alive;
  };
  bool SpawnGroup(int restart_count);
  // Waits on the signal fd until a worker exits or a signal arrives, or `deadline` passes.
  // Returns the forwarded signal number if one arrived, else 0.
  int WaitEvent(std::chrono::steady_clock::time_point deadline);
  void ReapAll();
  void StopGroup(int first_signal);
  int AliveCount() const;
  void PrintFailureSummary(const WorkerExit& first, int restart_count) const;
  std::string ErrorFile(int restart_count, int local_rank) const;

  AgentOptions options_;
  int signal_fd_ = -1;
  std::vector<Worker> workers_;
  std::vector<WorkerExit> exits_;
};

}  // namespace dlrun::launcher
