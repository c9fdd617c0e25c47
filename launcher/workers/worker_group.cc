#include "launcher/workers/worker_group.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "common/signal_name.h"
#include "launcher/workers/spawn_spec.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

absl::Status WorkerGroup::Start(const Assignment& current, int attempt) {
  current_ = current;
  attempt_ = attempt;
  workers_.clear();
  exits_.clear();
  oom_kills_at_spawn_ = processes_.facts().OomKills();
  // Admitted into a running group (docs/RECOVERY.md, "A node that joins"): every local rank
  // takes the state from a peer in that generation, as a lost rank's replacement does.
  const int admitted_at = current_.recovery_generation;
  for (int lr = 0; lr < options_.nproc; ++lr) {
    SpawnSpec spec = MakeSpawnSpec(options_, spare_argv_, current_, run_dir_, attempt_, lr);
    if (admitted_at > 0) spec.env[contract::kRecoveryGen] = absl::StrCat(admitted_at);
    auto pid = processes_.Spawn(spec);
    if (!pid.ok()) {
      return absl::InternalError(
          absl::StrCat("cannot start local rank ", lr, ": ", pid.status().message()));
    }
    Worker w;
    w.local_rank = lr;
    w.rank = current_.rank_offset + lr;
    w.pid = *pid;
    w.alive = true;
    workers_.push_back(w);
    if (options_.profiler && options_.profiler->Wants(w.rank)) {
      options_.profiler->Started(w.rank, w.pid);
    }
  }
  return absl::OkStatus();
}

bool WorkerGroup::Replace(const std::vector<WorkerExit>& lost, const Assignment& next,
                          int generation, std::vector<std::string>* replaced) {
  for (const WorkerExit& e : lost) {
    SpawnSpec spec = MakeSpawnSpec(options_, spare_argv_, next, run_dir_, attempt_, e.local_rank);
    spec.env[contract::kRecoveryGen] = absl::StrCat(generation);
    // The lost worker's logs stay: the replacement writes beside them.
    for (StreamRoute* r : {&spec.out, &spec.err}) {
      if (r->log_path.empty()) continue;
      const size_t dot = r->log_path.rfind(".log");
      r->log_path = absl::StrCat(r->log_path.substr(0, dot), ".gen", generation, ".log");
    }
    absl::StatusOr<pid_t> pid = processes_.Spawn(spec);
    if (!pid.ok()) {
      spdlog::warn("no in-process recovery: cannot start local rank {} again: {}", e.local_rank,
                   std::string(pid.status().message()));
      return false;
    }
    for (Worker& w : workers_) {
      if (w.local_rank != e.local_rank) continue;
      w.pid = *pid;
      w.alive = true;
      w.recoverable = true;  // the same program; it declares again at start
      w.done = false;
      replaced->push_back(absl::StrCat("local rank ", w.local_rank, " as pid ", w.pid));
    }
  }
  return true;
}

std::optional<WorkerExit> WorkerGroup::Exited(pid_t pid, int exit_code, int signal, double wall_s) {
  Worker* found = Live(pid);
  if (found == nullptr) return std::nullopt;
  Worker& w = *found;
  w.alive = false;
  WorkerExit x;
  x.local_rank = w.local_rank;
  x.global_rank = current_.rank_offset + w.local_rank;
  x.pid = pid;
  x.exit_code = exit_code;
  x.signal = signal;
  x.when_s = wall_s;
  x.stopped = stopping_;
  x.after_done = w.done && signal != 0 && !stopping_;
  if (x.after_done) {
    spdlog::warn(
        "rank {} (pid {}) died of SIG{} after it said its work was done (dlrun_report.done()): "
        "counted as finished; a crash in the interpreter's teardown, such as PyTorch's "
        "\"terminate called without an active exception\" (docs/USAGE.md, Done)",
        x.global_rank, pid, dlrun::SignalAbbrev(signal));
  }
  if (options_.profiler && options_.profiler->Wants(w.rank)) options_.profiler->Exited(w.rank);
  exits_.push_back(x);
  if (x.signal != 0 && IsPassthrough(x.signal)) {
    // Seen, not predicted: a worker's handlers read from /proc just before the signal can be
    // gone a moment later without harm (an interpreter that is exiting resets them).
    spdlog::warn("rank {} died of SIG{}, passed on by dlrun: it has no handler for it",
                 x.global_rank, dlrun::SignalAbbrev(x.signal));
    if (!passthrough_hint_given_) {
      passthrough_hint_given_ = true;
      spdlog::warn(
          "to checkpoint on a preemption warning instead, a Python program uses "
          "dlrun_report.Preemption() and a C++ one catches the signal "
          "(docs/USAGE.md, Preemption)");
    }
  }
  return x;
}

WorkerGroup::Worker* WorkerGroup::Live(pid_t pid) {
  for (Worker& w : workers_) {
    if (w.pid == pid && w.alive) return &w;
  }
  return nullptr;
}

void WorkerGroup::Done(pid_t pid) {
  if (Worker* w = Live(pid)) w->done = true;
}

int WorkerGroup::Declared(pid_t pid) {
  Worker* w = Live(pid);
  if (w == nullptr) return -1;
  w->recoverable = true;
  return w->local_rank;
}

bool WorkerGroup::IsPassthrough(int sig) const {
  const auto& p = options_.passthrough_signals;
  return std::find(p.begin(), p.end(), sig) != p.end();
}

void WorkerGroup::PassOn(int sig) {
  for (const Worker& w : workers_) {
    if (w.alive) processes_.SignalGroup(w.pid, sig);
  }
}

void WorkerGroup::Signal(int first_signal) {
  for (const Worker& w : workers_) {
    if (!w.alive) continue;
    int sig = first_signal;
    // A forwarded SIGINT that the worker ignores (inherited from a shell's `dlrun ... &`) would
    // only wait out the grace period: SIGTERM instead, which asks the same.
    if (sig != SIGTERM && sig != SIGKILL &&
        processes_.facts().Disposition(w.pid, sig) == ProcessFacts::SignalAction::kIgnored) {
      spdlog::info("local rank {} (pid {}) ignores SIG{}: sending SIGTERM instead", w.local_rank,
                   w.pid, dlrun::SignalAbbrev(sig));
      sig = SIGTERM;
    }
    processes_.SignalGroup(w.pid, sig);
    // A stopped worker (SIGSTOP) would keep the signal pending for the whole grace period.
    if (processes_.facts().Stopped(w.pid)) processes_.SignalGroup(w.pid, SIGCONT);
  }
}

void WorkerGroup::Kill() {
  for (const Worker& w : workers_) {
    if (w.alive) {
      spdlog::warn("local rank {} (pid {}) did not stop within {} ms: SIGKILL", w.local_rank, w.pid,
                   options_.grace.count());
    }
    processes_.SignalGroup(w.pid, SIGKILL);  // a leader's exit does not end its children
  }
}

void WorkerGroup::NameStuck() const {
  for (const Worker& w : workers_) {
    if (!w.alive) continue;
    spdlog::error(
        "local rank {} (pid {}) is still there {} ms after SIGKILL (stuck in the "
        "kernel, e.g. uninterruptible I/O): going on without it",
        w.local_rank, w.pid, options_.kill_wait.count());
  }
}

void WorkerGroup::DropFailedExits() {
  exits_.erase(
      std::remove_if(exits_.begin(), exits_.end(), [](const WorkerExit& e) { return e.failed(); }),
      exits_.end());
}

void WorkerGroup::MoveTo(const Assignment& next) {
  for (Worker& w : workers_) w.rank = next.rank_offset + w.local_rank;
  current_ = next;
}

std::vector<int> WorkerGroup::StoppedRanks() const {
  std::vector<int> stopped;
  for (const Worker& w : workers_) {
    if (w.alive && processes_.facts().Stopped(w.pid)) stopped.push_back(w.rank);
  }
  return stopped;
}

bool WorkerGroup::OomKilled() const {
  const int64_t oom_kills = processes_.facts().OomKills();
  return oom_kills >= 0 && oom_kills_at_spawn_ >= 0 && oom_kills > oom_kills_at_spawn_;
}

void WorkerGroup::WriteWorkersFile(const JobChannel::RdzvAddress& rdzv) const {
  if (options_.run_dir.empty()) return;  // for `dlrun stacks`
  const WorkersFile wf{current_.run_id,
                       options_.hostname,
                       getpid(),
                       attempt_,
                       DumpTargets(workers_, /*live_only=*/false),
                       rdzv.endpoint,
                       rdzv.token};
  if (absl::Status s = run_dir_.WriteWorkers(wf); !s.ok()) {
    spdlog::debug("{}", std::string(s.message()));
  }
}

}  // namespace dlrun::launcher
