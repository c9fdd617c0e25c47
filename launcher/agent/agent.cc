#include "launcher/agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/signal_name.h"
#include "launcher/stacks/stacks.h"
#include "launcher/workers/spawn_spec.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

Agent::Agent(AgentOptions options, JobLink link, Processes& processes, Clock& clock)
    : options_(std::move(options)),
      source_(std::move(link.membership)),
      channel_(std::move(link.channel)),
      processes_(processes),
      clock_(clock),
      run_dir_(*options_.file_system, options_.run_dir, options_.keep_run_dir, options_.log_dir),
      telemetry_(options_.telemetry, options_.hostname, *channel_, clock_, *options_.file_system),
      forensics_(options_, run_dir_, telemetry_, clock_),
      diagnostics_(options_, *channel_, telemetry_),
      group_(options_, processes_, run_dir_),
      failures_({options_, processes_, clock_, run_dir_, telemetry_, forensics_, *source_, group_,
                 [this](int sig) { StopGroup(sig); }}),
      recovery_(
          {options_, processes_, clock_, telemetry_, run_dir_, failures_.hang(), group_, *channel_},
          options_.recovery == AgentOptions::Recovery::kRestart ? nullptr
                                                                : std::move(link.regroup)) {
  // A start that waits for the fork server's imports heartbeats meanwhile (the verdict is
  // read at the loop's next check).
  if (source_->check_interval().count() > 0) {
    processes_.BeatWhileWaiting(
        [this] {
          std::string ignored;
          source_->Check(&ignored);
        },
        source_->check_interval());
  }
}

absl::Status Agent::SpawnGroup(const Assignment& next, int attempt, SteadyTime assigned_at) {
  if (absl::Status s = group_.Start(next, attempt); !s.ok()) return s;
  const Assignment& current = group_.current();
  if (group_.attempt() == 0 && current.rank_offset == 0) WarnOfProfileRanksNotInTheJob();
  failures_.hang().Start(PidsOf(group_.workers()), clock_.Now());
  const std::vector<DumpTarget> group = DumpTargets(group_.workers(), /*live_only=*/false);
  spdlog::info(
      "{}", GroupTable(current, group, {fault_seen_at_, stopped_at_, assigned_at, clock_.Now()}));
  std::vector<AgentTelemetry::Member> members;
  for (const DumpTarget& t : group) {
    members.push_back({t.rank, t.local_rank, t.pid, true, processes_.HowStarted(t.pid)});
  }
  telemetry_.GroupStarted(std::move(members), current, assigned_at);
  fault_seen_at_.reset();
  stopped_at_.reset();
  recovery_.GroupStarted(clock_.Now());
  group_.WriteWorkersFile(channel_->Address());
  return absl::OkStatus();
}

void Agent::WarnOfProfileRanksNotInTheJob() const {
  if (!options_.profiler) return;
  std::vector<int> beyond;
  for (int r : options_.profiler->Ranks()) {
    if (r >= group_.current().world_size) beyond.push_back(r);
  }
  if (beyond.empty()) return;
  spdlog::warn("--profile-ranks: the job has ranks 0-{} (world size {}): {} {} not profiled",
               group_.current().world_size - 1, group_.current().world_size, RanksPhrase(beyond),
               beyond.size() == 1 ? "is" : "are");
}

int Agent::HandleEvents(const std::vector<ProcEvent>& events) {
  int stop = 0;
  for (const ProcEvent& e : events) {
    // The worker a step record is about (its rank names a refusal and the profiler's counts);
    // not looked up for the other events (heartbeats come with every read of a pipe).
    const WorkerGroup::Worker* w = nullptr;
    if (e.kind == ProcEvent::Kind::kStep) {
      for (const WorkerGroup::Worker& x : group_.workers()) {
        if (x.pid == e.pid) w = &x;
      }
    }
    EventFacts facts;
    facts.passthrough = e.kind == ProcEvent::Kind::kSignal && group_.IsPassthrough(e.signal);
    facts.profiled = w != nullptr && e.step.kind == RecordKind::kStep && options_.profiler &&
                     options_.profiler->Wants(w->rank);
    const Sinks to = RouteOf(e, facts);
    if (Has(to, Sink::kGroupExit) &&
        group_.Exited(e.pid, e.exit_code, e.signal, clock_.WallSeconds())) {
      if (Has(to, Sink::kTelemetryExit)) telemetry_.Exited(e.pid, e.cpu_s, e.rss_peak_bytes);
      if (Has(to, Sink::kHangExit)) failures_.hang().Exited(e.pid);
    }
    if (Has(to, Sink::kHangBeat)) failures_.hang().Beat(e.pid, clock_.Now());
    if (Has(to, Sink::kPassOn)) {
      spdlog::info("forwarding SIG{} to the workers", dlrun::SignalAbbrev(e.signal));
      group_.PassOn(e.signal);
    }
    if (Has(to, Sink::kStop) && stop == 0) stop = e.signal;
    if (Has(to, Sink::kRecovery)) recovery_.Record(e.pid, e.step.kind, e.step.step);
    if (Has(to, Sink::kDone)) group_.Done(e.pid);
    if (Has(to, Sink::kRefusalLine) && w != nullptr) {  // the tracebacks are in the logs
      spdlog::warn("rank {} refused the in-process recovery: {}", w->rank, e.step.what);
    }
    if (Has(to, Sink::kTelemetryRecord)) telemetry_.Step(e.pid, e.step);
    if (Has(to, Sink::kHangRecord)) failures_.hang().Record(e.pid, e.step, clock_.Now());
    if (Has(to, Sink::kProfilerStep)) options_.profiler->Step(w->rank, e.step.step);
    if (Has(to, Sink::kBadRecord)) telemetry_.steps().BadRecord();
  }
  return stop;
}

Agent::Watch Agent::WatchGroup() {
  using Outcome = Watch::Outcome;
  const Millis interval = source_->check_interval();
  SteadyTime next_check = interval.count() > 0 ? clock_.Now() + interval : SteadyTime::max();
  // A node whose every rank was lost (one rank a node) waits for the job's answer with none alive.
  while (AliveCount(group_.workers()) > 0 || recovery_.under_way()) {
    SteadyTime next_hang;
    if (std::optional<FailurePolicy::Hung> hung = failures_.CheckHangs(&next_hang)) {
      return {Outcome::kHung, hung->reason, 0, hung->rank};
    }
    const int forwarded =
        HandleEvents(processes_.Wait(std::min({next_check, next_hang, telemetry_.Due(),
                                               recovery_.deadline().value_or(SteadyTime::max())})));
    telemetry_.SetSpares(processes_.SparePids());
    telemetry_.MaybePublish();
    if (forwarded != 0) return {Outcome::kSignalled, "", forwarded};
    if (std::optional<std::string> why = recovery_.Follow()) {
      return {Outcome::kUnrecovered, *why, 0};
    }
    const std::vector<WorkerExit>& exits = group_.exits();
    const bool failed =
        std::any_of(exits.begin(), exits.end(), [](const WorkerExit& e) { return e.failed(); });
    if (failed && !recovery_.Recover()) return {Outcome::kFailed, "", 0};
    // Across nodes, the answer to this node's own ask may carry the port already.
    if (std::optional<std::string> why = failed ? recovery_.Follow() : std::nullopt) {
      return {Outcome::kUnrecovered, *why, 0};
    }
    if (std::optional<std::string> why = recovery_.Tick()) return {Outcome::kUnrecovered, *why, 0};
    if (clock_.Now() >= next_check) {
      std::string reason;
      const MembershipSource::Verdict verdict = source_->Check(&reason);
      diagnostics_.Poll(DumpTargets(group_.workers(), /*live_only=*/true));
      switch (verdict) {
        case MembershipSource::Verdict::kContinue:
          break;
        case MembershipSource::Verdict::kRestart:
          return {Outcome::kRestart, reason, 0};
        case MembershipSource::Verdict::kStop:
        case MembershipSource::Verdict::kFinished:
          return {Outcome::kStop, reason, 0};
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
  while (AliveCount(group_.workers()) > 0 && clock_.Now() < deadline) {
    HandleEvents(processes_.Wait(std::min(deadline, next_check)));
    if (clock_.Now() >= next_check) {
      std::string ignored;
      source_->Check(&ignored);
      diagnostics_.Poll(DumpTargets(group_.workers(), /*live_only=*/true));
      next_check = clock_.Now() + interval;
    }
  }
  return AliveCount(group_.workers()) == 0;
}

void Agent::StopGroup(int first_signal) {
  group_.set_stopping(true);
  group_.Signal(first_signal);
  WaitForGroup(clock_.Now() + options_.grace);
  group_.Kill();
  if (!WaitForGroup(clock_.Now() + options_.kill_wait)) group_.NameStuck();
  processes_.CloseOutputs();
  group_.set_stopping(false);
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
    diagnostics_.Poll(DumpTargets(group_.workers(), /*live_only=*/true));
    switch (verdict) {
      case MembershipSource::Verdict::kContinue:
        continue;
      case MembershipSource::Verdict::kFinished:
        return 0;
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
  // Other wakes come meanwhile too (a peer node's in-process recovery asks for a regroup): the
  // loop ends on the join's own answer, never on a wake alone.
  struct Shared {
    std::mutex mu;
    bool done = false;
    absl::StatusOr<Assignment> result = absl::UnknownError("the join gave no answer");
  };
  auto shared = std::make_shared<Shared>();
  MembershipSource* src = source_.get();
  Processes* procs = &processes_;
  std::thread([shared, src, procs] {
    auto r = src->Next();
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->result = std::move(r);
      shared->done = true;
    }
    procs->Wake();  // after `done`: the Wait that follows a check of `done` cannot miss it
  }).detach();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      if (shared->done) return shared->result;
    }
    *signal = HandleEvents(processes_.Wait(SteadyTime::max()));
    if (*signal != 0) return absl::CancelledError("interrupted by a signal");
  }
}

int Agent::Run() {
  const double start = clock_.WallSeconds();
  telemetry_.Start();
  const int rc = RunAttempts();
  forensics_.WaitForCaptures();  // their files and lines before the end
  diagnostics_.CollectProfiles();
  telemetry_.Finish(rc, clock_.WallSeconds() - start, group_.current());
  run_dir_.Finish(rc);
  return rc;
}

int Agent::RunAttempts() {
  for (int attempt = 0;; ++attempt) {
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
    if (absl::Status s = SpawnGroup(*next, attempt, clock_.Now()); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      StopGroup(SIGKILL);
      return 1;
    }
    int rc = FailurePolicy::kRecoverInProcess;
    while (rc == FailurePolicy::kRecoverInProcess) {  // a hung rank killed alone: watch on
      const Watch w = WatchGroup();
      if (w.outcome != Watch::Outcome::kSucceeded) {
        fault_seen_at_ = clock_.Now();
        telemetry_.FaultSeen(*fault_seen_at_);
      }
      rc = Verdict(w);
    }
    if (rc >= 0) return rc;
  }
}

int Agent::Verdict(const Watch& w) {
  switch (w.outcome) {
    case Watch::Outcome::kSucceeded:
      return AfterSuccess();
    case Watch::Outcome::kFailed:
      return failures_.AfterFailure(recovery_.recovering_from(), recovery_.applies());
    case Watch::Outcome::kUnrecovered:
      spdlog::error("{}: restarting from the checkpoint instead", w.reason);
      failures_.StopWithCapture("an in-process recovery that did not end");
      telemetry_.MaybePublish(/*now_anyway=*/true);
      return source_->OnFailure(w.reason, false) ? -1 : 1;
    case Watch::Outcome::kHung:
      return failures_.AfterHang({w.reason, w.rank},
                                 recovery_.applies() && !recovery_.under_way());
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
      failures_.StopWithCapture("a new round: another node failed or was lost");
      return -1;
    case Watch::Outcome::kStop:
      spdlog::error("the rendezvous stopped the job: {}", w.reason);
      StopGroup(SIGTERM);
      return 1;
  }
  return 1;
}

}  // namespace dlrun::launcher
