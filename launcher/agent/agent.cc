#include "launcher/agent/agent.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_format.h"
#include "common/contract.h"
#include "common/signal_name.h"
#include "launcher/agent/spawn_spec.h"
#include "launcher/stacks/stacks.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

Agent::Agent(AgentOptions options, JobLink link, Processes& processes, Clock& clock)
    : options_(std::move(options)),
      source_(std::move(link.membership)),
      channel_(std::move(link.channel)),
      regroup_(options_.recovery == AgentOptions::Recovery::kRestart ? nullptr
                                                                     : std::move(link.regroup)),
      processes_(processes),
      clock_(clock),
      recovery_({.asked_for = options_.recovery != AgentOptions::Recovery::kRestart &&
                              static_cast<bool>(options_.pick_master_port),
                 .single_node_job = options_.single_node_job,
                 .can_regroup = regroup_ != nullptr,
                 .timeout = options_.recovery_timeout}),
      hang_(options_.hang),
      run_dir_(*options_.file_system, options_.run_dir, options_.keep_run_dir, options_.log_dir),
      telemetry_(options_.telemetry, options_.hostname, *channel_, clock_,
                 *options_.file_system),
      forensics_(options_, run_dir_, telemetry_, clock_),
      diagnostics_(options_, *channel_, telemetry_) {
  if (regroup_) regroup_->Watch([procs = &processes_] { procs->Wake(); });
}

bool Agent::IsPassthrough(int sig) const {
  const auto& p = options_.passthrough_signals;
  return std::find(p.begin(), p.end(), sig) != p.end();
}

void Agent::PassOn(int sig) {
  for (const Worker& w : workers_) {
    if (w.alive) processes_.SignalGroup(w.pid, sig);
  }
}

void Agent::NoteDeathByPassedOnSignal(const WorkerExit& x) {
  if (x.signal == 0 || !IsPassthrough(x.signal)) return;
  // Seen, not predicted: a worker's handlers read from /proc just before the signal can be
  // gone a moment later without harm (an interpreter that is exiting resets them).
  spdlog::warn("rank {} died of SIG{}, passed on by dlrun: it has no handler for it",
               x.global_rank, dlrun::SignalAbbrev(x.signal));
  if (passthrough_hint_given_) return;
  passthrough_hint_given_ = true;
  spdlog::warn("to checkpoint on a preemption warning instead, a Python program uses "
               "dlrun_report.Preemption() and a C++ one catches the signal (docs/USAGE.md, "
               "Preemption)");
}

absl::Status Agent::SpawnGroup(SteadyTime assigned_at) {
  workers_.clear();
  oom_kills_at_spawn_ = processes_.OomKills();
  // Admitted into a running group (docs/RECOVERY.md, "A node that joins"): every local rank
  // takes the state from a peer in that generation, as a lost rank's replacement does.
  const int admitted_at = current_.recovery_generation;
  for (int lr = 0; lr < options_.nproc; ++lr) {
    SpawnSpec spec = MakeSpawnSpec(options_, current_, run_dir_, attempt_, lr);
    if (admitted_at > 0) spec.env[contract::kRecoveryGen] = absl::StrCat(admitted_at);
    auto pid = processes_.Spawn(spec);
    if (!pid.ok()) {
      return absl::InternalError(absl::StrCat("cannot start local rank ", lr, ": ",
                                              pid.status().message()));
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
  if (attempt_ == 0 && current_.rank_offset == 0) WarnOfProfileRanksNotInTheJob();
  std::vector<DumpTarget> group;
  std::vector<pid_t> pids;
  for (const Worker& w : workers_) {
    group.push_back({w.rank, w.local_rank, w.pid});
    pids.push_back(w.pid);
  }
  hang_.Start(pids, clock_.Now());
  spdlog::info("{}", GroupTable(current_, group,
                                {fault_seen_at_, stopped_at_, assigned_at, clock_.Now()}));
  std::vector<AgentTelemetry::Member> members;
  for (const Worker& w : workers_) members.push_back({w.rank, w.local_rank, w.pid, true});
  telemetry_.GroupStarted(std::move(members), current_, assigned_at);
  fault_seen_at_.reset();
  stopped_at_.reset();
  recovery_.GroupStarted(admitted_at, pids, clock_.Now());
  if (admitted_at > 0) {
    spdlog::info(
        "admitted into the running group at generation {} (master port {}): every "
        "rank here takes the state from a peer",
        admitted_at, current_.master_port);
  }
  TellInProcess();
  WriteWorkersFile(group);
  return absl::OkStatus();
}

void Agent::WarnOfProfileRanksNotInTheJob() const {
  if (!options_.profiler) return;
  std::vector<int> beyond;
  for (int r : options_.profiler->Ranks()) {
    if (r >= current_.world_size) beyond.push_back(r);
  }
  if (beyond.empty()) return;
  spdlog::warn("--profile-ranks: the job has ranks 0-{} (world size {}): {} {} not profiled",
               current_.world_size - 1, current_.world_size,
               RanksPhrase(beyond), beyond.size() == 1 ? "is" : "are");
}

void Agent::WriteWorkersFile(const std::vector<DumpTarget>& group) {
  if (options_.run_dir.empty()) return;  // for `dlrun stacks`
  const JobChannel::RdzvAddress rdzv = channel_->Address();
  const WorkersFile wf{current_.run_id, options_.hostname, getpid(), attempt_, group,
                       rdzv.endpoint, rdzv.token};
  if (absl::Status s = run_dir_.WriteWorkers(wf); !s.ok()) {
    spdlog::debug("{}", std::string(s.message()));
  }
}

int Agent::HandleEvents(const std::vector<ProcEvent>& events) {
  int forwarded = 0;
  for (const ProcEvent& e : events) {
    switch (e.kind) {
      case ProcEvent::Kind::kExited:
        for (Worker& w : workers_) {
          if (w.pid != e.pid || !w.alive) continue;
          w.alive = false;
          WorkerExit x;
          x.local_rank = w.local_rank;
          x.global_rank = current_.rank_offset + w.local_rank;
          x.pid = e.pid;
          x.exit_code = e.exit_code;
          x.signal = e.signal;
          x.when_s = clock_.WallSeconds();
          x.stopped = stopping_;
          NoteDeathByPassedOnSignal(x);
          telemetry_.Exited(e.pid);
          hang_.Exited(e.pid);
          if (options_.profiler && options_.profiler->Wants(w.rank)) {
            options_.profiler->Exited(w.rank);
          }
          exits_.push_back(x);
        }
        break;
      case ProcEvent::Kind::kHeartbeat:
        hang_.Beat(e.pid, clock_.Now());
        break;
      case ProcEvent::Kind::kSignal:
        if (IsPassthrough(e.signal)) {
          spdlog::info("forwarding SIG{} to the workers", dlrun::SignalAbbrev(e.signal));
          PassOn(e.signal);
        } else if (forwarded == 0) {
          forwarded = e.signal;
        }
        break;
      case ProcEvent::Kind::kWake:
        woken_ = true;
        break;
      case ProcEvent::Kind::kStep:
        if (e.step.kind == 'C' || e.step.kind == 'P') {
          for (Worker& w : workers_) {
            if (w.pid != e.pid || !w.alive) continue;
            w.recoverable = true;
            if (e.step.kind == 'C') SpareOnDeclaration(w.local_rank);
          }
          if (e.step.kind == 'P') StateFromPeer(e.pid, e.step.step);
          TellInProcess();
        }
        telemetry_.Step(e.pid, e.step);
        hang_.Record(e.pid, e.step, clock_.Now());
        if (options_.profiler && e.step.kind == 'S') {
          for (const Worker& w : workers_) {
            if (w.pid == e.pid && options_.profiler->Wants(w.rank)) {
              options_.profiler->Step(w.rank, e.step.step);
            }
          }
        }
        break;
      case ProcEvent::Kind::kBadRecord:
        telemetry_.BadRecord();
        break;
    }
  }
  return forwarded;
}

int Agent::AliveCount() const {
  int n = 0;
  for (const Worker& w : workers_) n += w.alive ? 1 : 0;
  return n;
}

Agent::Watch Agent::WatchGroup() {
  using Outcome = Watch::Outcome;
  const Millis interval = source_->check_interval();
  SteadyTime next_check = interval.count() > 0 ? clock_.Now() + interval : SteadyTime::max();
  while (AliveCount() > 0) {
    SteadyTime next_hang;
    if (std::optional<Watch> hung = CheckHangs(&next_hang)) return *hung;
    const int forwarded = HandleEvents(processes_.Wait(std::min(
        {next_check, next_hang, telemetry_.Due(), recovery_.deadline().value_or(SteadyTime::max())})));
    telemetry_.SetSpares(processes_.SparePids());
    telemetry_.MaybePublish();
    if (forwarded != 0) return {Outcome::kSignalled, "", forwarded};
    if (std::optional<Watch> out = FollowRegroup()) return *out;
    const bool failed = std::any_of(exits_.begin(), exits_.end(),
                                    [](const WorkerExit& e) { return e.failed(); });
    if (failed && !RecoverInProcess()) return {Outcome::kFailed, "", 0};
    // Across nodes, the answer to this node's own ask may carry the port already.
    if (std::optional<Watch> out = failed ? FollowRegroup() : std::nullopt) return *out;
    if (const RecoveryMachine::Decision d = recovery_.Tick(clock_.Now(), exits_);
        d.kind == RecoveryMachine::Decision::Kind::kUnrecovered) {
      return {Outcome::kUnrecovered, d.why, 0};
    }
    if (clock_.Now() >= next_check) {
      std::string reason;
      const MembershipSource::Verdict verdict = source_->Check(&reason);
      diagnostics_.Poll(LiveTargets());
      switch (verdict) {
        case MembershipSource::Verdict::kContinue: break;
        case MembershipSource::Verdict::kRestart: return {Outcome::kRestart, reason, 0};
        case MembershipSource::Verdict::kStop:
        case MembershipSource::Verdict::kFinished: return {Outcome::kStop, reason, 0};
      }
      next_check = clock_.Now() + interval;
    }
  }
  return {Outcome::kSucceeded, "", 0};
}

bool Agent::WaitForGroup(SteadyTime deadline) {
  // Stopping can take the whole grace period (a worker that ignores SIGTERM, or is stopped):
  // keep heartbeating meanwhile, or the rendezvous declares this live node dead. The verdict
  // does not matter here: the group is being stopped anyway.
  const Millis interval = source_->check_interval();
  SteadyTime next_check = interval.count() > 0 ? clock_.Now() + interval : SteadyTime::max();
  while (AliveCount() > 0 && clock_.Now() < deadline) {
    HandleEvents(processes_.Wait(std::min(deadline, next_check)));
    if (clock_.Now() >= next_check) {
      std::string ignored;
      source_->Check(&ignored);
      diagnostics_.Poll(LiveTargets());
      next_check = clock_.Now() + interval;
    }
  }
  return AliveCount() == 0;
}

void Agent::StopGroup(int first_signal) {
  stopping_ = true;
  for (const Worker& w : workers_) {
    if (!w.alive) continue;
    int sig = first_signal;
    // A forwarded SIGINT that the worker ignores (inherited from a shell's `dlrun ... &`) would
    // only wait out the grace period: SIGTERM instead, which asks the same.
    if (sig != SIGTERM && sig != SIGKILL &&
        processes_.Disposition(w.pid, sig) == Processes::SignalAction::kIgnored) {
      spdlog::info("local rank {} (pid {}) ignores SIG{}: sending SIGTERM instead", w.local_rank,
                   w.pid, dlrun::SignalAbbrev(sig));
      sig = SIGTERM;
    }
    processes_.SignalGroup(w.pid, sig);
    // A stopped worker (SIGSTOP) would keep the signal pending for the whole grace period.
    if (processes_.Stopped(w.pid)) processes_.SignalGroup(w.pid, SIGCONT);
  }
  WaitForGroup(clock_.Now() + options_.grace);
  for (const Worker& w : workers_) {
    if (w.alive) {
      spdlog::warn("local rank {} (pid {}) did not stop within {} ms: SIGKILL", w.local_rank,
                   w.pid, options_.grace.count());
    }
    processes_.SignalGroup(w.pid, SIGKILL);  // a leader's exit does not end its children
  }
  if (!WaitForGroup(clock_.Now() + options_.kill_wait)) {
    for (const Worker& w : workers_) {
      if (!w.alive) continue;
      spdlog::error("local rank {} (pid {}) is still there {} ms after SIGKILL (stuck in the "
                    "kernel, e.g. uninterruptible I/O): going on without it",
                    w.local_rank, w.pid, options_.kill_wait.count());
    }
  }
  processes_.CloseOutputs();
  stopping_ = false;
  if (fault_seen_at_) {
    stopped_at_ = clock_.Now();
    telemetry_.Stopped(*stopped_at_);
  }
}

int Agent::AfterSuccess() {
  processes_.CloseOutputs();
  spdlog::info("all {} worker(s) finished successfully", options_.nproc);
  diagnostics_.CollectProfiles();
  // The final figures go with the leave.
  telemetry_.MaybePublish(/*now_anyway=*/true, /*all_steps=*/true);
  source_->OnSuccess();
  const Millis interval = source_->check_interval();
  if (interval.count() == 0) return 0;
  // Wait for the other nodes: a failure elsewhere restarts this node's workers too.
  for (;;) {
    const int sig = HandleEvents(processes_.Wait(clock_.Now() + interval));
    if (sig != 0) return 128 + sig;
    std::string reason;
    const MembershipSource::Verdict verdict = source_->Check(&reason);
    diagnostics_.Poll(LiveTargets());
    switch (verdict) {
      case MembershipSource::Verdict::kContinue: continue;
      case MembershipSource::Verdict::kFinished: return 0;
      case MembershipSource::Verdict::kStop:
        spdlog::error("the rendezvous stopped the job: {}", reason);
        return 1;
      case MembershipSource::Verdict::kRestart:
        spdlog::warn("the rendezvous opened a new round ({}): running again", reason);
        return -1;
    }
  }
}

absl::StatusOr<Assignment> Agent::NextAssignment(int* signal) {
  *signal = 0;
  if (!source_->NextMayBlock()) return source_->Next();
  // The join blocks: run it on a helper thread that wakes the loop, so signals still arrive.
  struct Shared {
    std::mutex mu;
    absl::StatusOr<Assignment> result = absl::UnknownError("pending");
  };
  auto shared = std::make_shared<Shared>();
  MembershipSource* src = source_.get();
  Processes* procs = &processes_;
  woken_ = false;
  std::thread([shared, src, procs] {
    auto r = src->Next();
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->result = std::move(r);
    }
    procs->Wake();
  }).detach();
  while (!woken_) {
    *signal = HandleEvents(processes_.Wait(SteadyTime::max()));
    if (*signal != 0) return absl::CancelledError("interrupted by a signal");
  }
  std::lock_guard<std::mutex> lock(shared->mu);
  return shared->result;
}

int Agent::Run() {
  const double start = clock_.WallSeconds();
  telemetry_.Start();
  const int rc = RunAttempts();
  forensics_.WaitForCaptures();  // their files and lines before the end
  diagnostics_.CollectProfiles();
  telemetry_.Finish(rc, clock_.WallSeconds() - start, current_);
  run_dir_.Finish(rc);
  return rc;
}

int Agent::RunAttempts() {
  for (;; ++attempt_) {
    exits_.clear();
    int sig = 0;
    absl::StatusOr<Assignment> next = NextAssignment(&sig);
    if (sig != 0) {
      spdlog::warn("received SIG{} while joining the rendezvous: exiting",
                   dlrun::SignalAbbrev(sig));
      fflush(nullptr);
      _exit(128 + sig);  // a join may still be in flight on its thread: skip destructors
    }
    if (!next.ok()) {
      spdlog::error("{}", std::string(next.status().message()));
      return 1;
    }
    current_ = *next;
    if (absl::Status s = SpawnGroup(clock_.Now()); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      StopGroup(SIGKILL);
      return 1;
    }
    const Watch w = WatchGroup();
    if (w.outcome != Watch::Outcome::kSucceeded) {
      fault_seen_at_ = clock_.Now();
      telemetry_.FaultSeen(*fault_seen_at_);
    }
    int rc = -1;
    switch (w.outcome) {
      case Watch::Outcome::kSucceeded:
        rc = AfterSuccess();
        break;
      case Watch::Outcome::kFailed:
        rc = AfterFailure();
        break;
      case Watch::Outcome::kUnrecovered:
        spdlog::error("{}: restarting from the checkpoint instead", w.reason);
        StopWithCapture("an in-process recovery that did not end");
        telemetry_.MaybePublish(/*now_anyway=*/true);
        if (!source_->OnFailure(w.reason, false)) return 1;
        break;
      case Watch::Outcome::kHung:
        rc = AfterHang(w.reason, w.rank);
        break;
      case Watch::Outcome::kSignalled:
        spdlog::warn("received SIG{}: forwarding to workers and stopping",
                     dlrun::SignalAbbrev(w.signal));
        StopGroup(w.signal);
        // The steps done since the last period's publication belong in the report too.
        telemetry_.MaybePublish(/*now_anyway=*/true, /*all_steps=*/true);
        source_->OnStop(absl::StrCat("agent received SIG", dlrun::SignalAbbrev(w.signal)));
        return 128 + w.signal;
      case Watch::Outcome::kRestart:
        spdlog::warn("the rendezvous opened a new round ({}): restarting workers", w.reason);
        StopWithCapture("a new round: another node failed or was lost");
        break;
      case Watch::Outcome::kStop:
        spdlog::error("the rendezvous stopped the job: {}", w.reason);
        StopGroup(SIGTERM);
        return 1;
    }
    if (rc >= 0) return rc;
  }
}

}  // namespace dlrun::launcher
