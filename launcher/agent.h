// The local agent: starts this node's workers, supervises them in one event loop, restarts the
// group on failure as its membership source allows, forwards signals, and never leaves a
// worker behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/worker_env.h"

namespace dlrun::launcher {

// Where the agent's place in the job comes from: fixed flags (standalone / static) or the
// gRPC rendezvous. Next() may block (a rendezvous join); the agent runs it on a helper thread so
// signals still reach it.
class MembershipSource {
 public:
  enum class Verdict { kContinue, kRestart, kStop, kFinished };
  virtual ~MembershipSource() = default;
  virtual absl::StatusOr<NodeAssignment> Next() = 0;
  // A local worker failed: returns true if the job goes on (a new round), false if it is over.
  virtual bool OnFailure(const std::string& reason) = 0;
  // Called every check_interval() while workers run (never if it is zero).
  virtual Verdict Check(std::string* reason) = 0;
  virtual std::chrono::milliseconds check_interval() const = 0;
  // Every local worker succeeded. The agent then keeps calling Check() until it says kFinished
  // (every node is done), kRestart (another node failed: run again) or kStop.
  virtual void OnSuccess() = 0;
};

// Fixed assignment; restarts are counted locally up to max_restarts. `pick_master_port`, when
// set, picks a fresh port per attempt (standalone).
std::unique_ptr<MembershipSource> MakeStaticSource(NodeAssignment base, int max_restarts,
                                                   std::function<int()> pick_master_port);

struct AgentOptions {
  std::vector<std::string> argv;  // what each worker runs (python prefix already applied)
  int nproc = 1;
  std::chrono::milliseconds grace{30000};
  std::vector<int> forwarded_signals;    // stop the job: e.g. SIGTERM, SIGINT, SIGHUP, SIGQUIT
  std::vector<int> passthrough_signals;  // forwarded as-is, the job goes on: SIGUSR1, SIGUSR2
  int omp_threads = 0;                   // > 0: set OMP_NUM_THREADS for workers
  std::string run_dir;                   // per-run scratch dir for error files
  // Output: every line is prefixed "[rank N]: " on the console. With log_dir, each worker's
  // streams also go to LOG_DIR/attempt_K/LOCAL_RANK/{stdout,stderr}.log. redirects[lr] /
  // tee[lr] are torchrun's 0-3 (1 stdout, 2 stderr, 3 both): redirected streams leave the
  // console. console_ranks (--local-ranks-filter): only these local ranks reach the console.
  std::string log_dir;
  std::vector<int> redirects;  // per local rank; empty = 0
  std::vector<int> console_ranks;  // empty = all
  // Hang detection: a worker that has sent at least one heartbeat (dlrun::worker::heartbeat()
  // or any byte written to $DLRUN_HEARTBEAT_FD) and then none for this long is treated as
  // failed. Zero: off.
  std::chrono::milliseconds hang_timeout{0};
  std::vector<int> cpus;  // CPUs to split between workers (empty: no pinning)
  std::vector<std::string> gpus;  // one device id per local rank -> CUDA_VISIBLE_DEVICES
};

// How one worker ended.
struct WorkerExit {
  int local_rank = -1;
  int global_rank = -1;
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, or 0
  double when_s = 0;  // wall clock seconds since the epoch
  bool stopped = false;  // ended while the agent was stopping the group (not a cause)
  bool failed() const { return signal != 0 || exit_code != 0; }
};

// Blocks SIGCHLD and `forwarded` in the calling thread; call it before any thread is started.
void BlockAgentSignals(const std::vector<int>& forwarded);

class Agent {
 public:
  // dlrun's exit code when a hung worker (see hang_timeout) ends the job.
  static constexpr int kHangExitCode = 124;
  Agent(AgentOptions options, std::unique_ptr<MembershipSource> source);
  // Runs until the job ends; returns the exit code for dlrun: 0, the first failing worker's code
  // (128+N for a signal), 1 when the job was stopped by the rendezvous, or 128+N if dlrun itself
  // got forwarded signal N.
  int Run();

 private:
  struct Stream {
    int fd = -1;  // read end of the worker's pipe, -1 once closed
    int console_fd = -1;  // 1, 2, or -1 (not shown)
    FILE* log = nullptr;
    std::string partial;  // an unfinished line
  };
  struct Worker {
    int local_rank = 0;
    pid_t pid = -1;
    bool alive = false;
    Stream out, err;
    int heartbeat_fd = -1;
    bool heartbeat_seen = false;
    std::chrono::steady_clock::time_point last_heartbeat;
  };
  bool SpawnGroup(const NodeAssignment& a);
  // Waits on the signal fd until a worker exits or a signal arrives, or `deadline` passes.
  // Returns the forwarded signal number if one arrived, else 0.
  int WaitEvent(std::chrono::steady_clock::time_point deadline, int extra_fd = -1);
  void ReapAll();
  void StopGroup(int first_signal);
  int AliveCount() const;
  // Picks the root cause among the failed workers (earliest error-file timestamp, else the
  // first to exit), prints it, and returns it.
  WorkerExit PrintFailureSummary() const;
  void DrainStream(Worker& w, Stream& s, bool flush);
  void CloseStreams();
  // A worker whose heartbeats stopped, or nullptr; `next` gets the next hang deadline.
  const Worker* FindHung(std::chrono::steady_clock::time_point* next) const;
  std::string ErrorFile(int local_rank) const;
  // Runs source_->Next() on a helper thread; a forwarded signal interrupts the wait.
  absl::StatusOr<NodeAssignment> NextAssignment(int* signal);

  AgentOptions options_;
  std::unique_ptr<MembershipSource> source_;
  NodeAssignment current_;
  int attempt_ = 0;
  int signal_fd_ = -1;
  std::vector<Worker> workers_;
  bool stopping_ = false;
  std::vector<WorkerExit> exits_;
};

}  // namespace dlrun::launcher
