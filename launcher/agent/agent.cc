#include "launcher/agent/agent.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_format.h"
#include "common/contract.h"
#include "launcher/agent/worker_env.h"
#include "launcher/stacks/crash_trace.h"
#include "launcher/stacks/flight_recorder.h"
#include "launcher/stacks/stacks.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

Agent::Agent(AgentOptions options, std::unique_ptr<MembershipSource> source,
             Processes& processes, Clock& clock)
    : options_(std::move(options)),
      source_(std::move(source)),
      processes_(processes),
      clock_(clock),
      telemetry_(options_.telemetry, options_.hostname, *source_, clock_) {}

std::string Agent::ErrorFile(int local_rank) const {
  return absl::StrCat(options_.run_dir, "/attempt_", attempt_, "/", local_rank, "/",
                      contract::kErrorFileName);
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
               x.global_rank, sigabbrev_np(x.signal));
  if (passthrough_hint_given_) return;
  passthrough_hint_given_ = true;
  spdlog::warn("to checkpoint on a preemption warning instead, a Python program uses "
               "dlrun_report.Preemption() and a C++ one catches the signal (docs/USAGE.md, "
               "Preemption)");
}

std::string Agent::ConsolePrefix(int rank, int local_rank) const {
  if (options_.console_prefix_template.empty()) return absl::StrCat("[rank ", rank, "]: ");
  return absl::StrReplaceAll(options_.console_prefix_template,
                             {{"${role_name}", current_.role},
                              {"${local_rank}", absl::StrCat(local_rank)},
                              {"${rank}", absl::StrCat(rank)},
                              {"${hostname}", options_.hostname}});
}

std::string Agent::AttemptLogDir() const {
  return absl::StrCat(options_.log_dir, "/attempt_", attempt_);
}

SpawnSpec Agent::MakeSpawnSpec(int lr) const {
  SpawnSpec spec;
  spec.local_rank = lr;
  spec.argv = options_.argv;
  spec.spare_argv = options_.spare_argv;
  const std::string err = ErrorFile(lr);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(err).parent_path(), ec);
  std::filesystem::remove(err, ec);  // a stale file must not be taken for this attempt's
  spec.env = BuildWorkerEnv(current_, lr, err, options_.omp_threads, options_.virtual_local_rank);
  for (const auto& [k, v] : options_.extra_env) spec.env[k] = v;
  for (const std::string& k : options_.keep_inherited) spec.env.erase(k);
  if (lr < static_cast<int>(options_.gpus.size())) {
    spec.env[contract::kCudaVisibleDevices] = options_.gpus[lr];
  }
  if (lr < static_cast<int>(options_.worker_cpus.size())) spec.cpus = options_.worker_cpus[lr];
  if (std::getenv(contract::kPythonFaultHandler) == nullptr) {
    spec.env.try_emplace(contract::kPythonFaultHandler, "1");  // a crash's faulting frame
  }
  spec.console_prefix = ConsolePrefix(current_.rank_offset + lr, lr);
  const int mode = lr < static_cast<int>(options_.redirects.size()) ? options_.redirects[lr] : 0;
  const auto& shown_ranks = options_.console_ranks;
  const bool shown = shown_ranks.empty() ||
                     std::find(shown_ranks.begin(), shown_ranks.end(), lr) != shown_ranks.end();
  spec.out.console_fd = shown && !(mode & 1) ? STDOUT_FILENO : -1;
  spec.stdout_pty = options_.stdout_pty && spec.out.console_fd >= 0;
  spec.err.console_fd = shown && !(mode & 2) ? STDERR_FILENO : -1;
  if (!options_.log_dir.empty()) {
    // The Flight Recorder's dumps (NCCL's on a collective timeout, Gloo's through dlrun_report)
    // in the attempt's directory, for AfterFailure; a user's own settings win.
    const std::string fr = absl::StrCat(AttemptLogDir(), "/", contract::kFrDir);
    std::filesystem::create_directories(fr, ec);
    auto unless_set = [&spec](std::initializer_list<const char*> names, const std::string& v) {
      for (const char* n : names) {
        if (std::getenv(n) != nullptr) return;
      }
      spec.env[*names.begin()] = v;
    };
    // torch >= 2.8's names only: it warns on every rank about the older TORCH_NCCL_ ones.
    unless_set({contract::kFrBufferSize, contract::kNcclTraceBufferSize}, "2000");
    unless_set({contract::kFrDumpOnTimeout, contract::kNcclDumpOnTimeout}, "1");
    unless_set({contract::kFrDumpTempFile, contract::kNcclDebugInfoTempFile},
               absl::StrCat(fr, "/", contract::kFrFilePrefix));
    const std::string dir = absl::StrCat(AttemptLogDir(), "/", lr);
    std::filesystem::create_directories(dir, ec);
    if (ec) spdlog::warn("cannot write logs in {}: {}", dir, ec.message());
    spec.out.log_path = dir + "/stdout.log";
    spec.err.log_path = dir + "/stderr.log";
  }
  return spec;
}

absl::Status Agent::SpawnGroup(SteadyTime assigned_at) {
  workers_.clear();
  oom_kills_at_spawn_ = processes_.OomKills();
  for (int lr = 0; lr < options_.nproc; ++lr) {
    auto pid = processes_.Spawn(MakeSpawnSpec(lr));
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
  }
  const Assignment& a = current_;
  std::string table = absl::StrCat("restart ", a.restart_count, ": node ", a.node_rank, " of ",
                                   a.num_nodes, ", world size ", a.world_size, ", master ",
                                   a.master_addr, ":", a.master_port);
  if (fault_seen_at_ && stopped_at_) {
    auto ms = [](SteadyTime from, SteadyTime to) {
      return std::chrono::duration_cast<Millis>(to - from).count();
    };
    absl::StrAppend(&table, " (after the fault: stop ", ms(*fault_seen_at_, *stopped_at_),
                    " ms, rendezvous ", ms(*stopped_at_, assigned_at), " ms, spawn ",
                    ms(assigned_at, clock_.Now()), " ms)");
  }
  std::vector<AgentTelemetry::Member> members;
  for (const Worker& w : workers_) members.push_back({w.rank, w.local_rank, w.pid, true});
  telemetry_.GroupStarted(std::move(members), current_, assigned_at);
  fault_seen_at_.reset();
  stopped_at_.reset();
  absl::StrAppend(&table, "\n  local_rank  rank  pid");
  for (const Worker& w : workers_) {
    absl::StrAppend(&table, "\n  ", absl::StrFormat("%-10d  %-4d  %d", w.local_rank,
                                                    a.rank_offset + w.local_rank, w.pid));
  }
  spdlog::info("{}", table);
  if (!options_.run_dir.empty()) {  // for `dlrun stacks`
    const MembershipSource::RdzvAddress rdzv = source_->Address();
    WorkersFile wf{current_.run_id, options_.hostname, getpid(), attempt_, {},
                   rdzv.endpoint, rdzv.token};
    for (const Worker& w : workers_) wf.workers.push_back({w.rank, w.local_rank, w.pid});
    if (absl::Status s = WriteWorkersFile(options_.run_dir, wf); !s.ok()) {
      spdlog::debug("{}", std::string(s.message()));
    }
  }
  return absl::OkStatus();
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
          exits_.push_back(x);
        }
        break;
      case ProcEvent::Kind::kHeartbeat:
        for (Worker& w : workers_) {
          if (w.pid != e.pid) continue;
          w.heartbeat_seen = true;
          w.last_heartbeat = clock_.Now();
        }
        break;
      case ProcEvent::Kind::kSignal:
        if (IsPassthrough(e.signal)) {
          spdlog::info("forwarding SIG{} to the workers", sigabbrev_np(e.signal));
          PassOn(e.signal);
        } else if (forwarded == 0) {
          forwarded = e.signal;
        }
        break;
      case ProcEvent::Kind::kWake:
        woken_ = true;
        break;
      case ProcEvent::Kind::kStep:
        telemetry_.Step(e.pid, e.step);
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

const Agent::Worker* Agent::FindHung(SteadyTime* next) const {
  *next = SteadyTime::max();
  if (options_.hang_timeout.count() == 0) return nullptr;
  const SteadyTime now = clock_.Now();
  for (const Worker& w : workers_) {
    if (!w.alive || !w.heartbeat_seen) continue;
    const SteadyTime due = w.last_heartbeat + options_.hang_timeout;
    if (due <= now) return &w;
    *next = std::min(*next, due);
  }
  return nullptr;
}

Agent::Watch Agent::WatchGroup() {
  using Outcome = Watch::Outcome;
  const Millis interval = source_->check_interval();
  SteadyTime next_check = interval.count() > 0 ? clock_.Now() + interval : SteadyTime::max();
  while (AliveCount() > 0) {
    SteadyTime next_hang;
    if (const Worker* hung = FindHung(&next_hang)) {
      return {Outcome::kHung,
              absl::StrCat("rank ", current_.rank_offset + hung->local_rank, " (local rank ",
                           hung->local_rank, ", pid ", hung->pid, ") hung: no heartbeat for ",
                           options_.hang_timeout.count(), " ms"),
              0};
    }
    const int forwarded =
        HandleEvents(processes_.Wait(std::min({next_check, next_hang, telemetry_.Due()})));
    telemetry_.MaybePublish();
    if (forwarded != 0) return {Outcome::kSignalled, "", forwarded};
    for (const WorkerExit& e : exits_) {
      if (e.failed()) return {Outcome::kFailed, "", 0};
    }
    if (clock_.Now() >= next_check) {
      std::string reason;
      const MembershipSource::Verdict verdict = source_->Check(&reason);
      AnswerStacks();
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
      AnswerStacks();
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
                   w.pid, sigabbrev_np(sig));
      sig = SIGTERM;
    }
    processes_.SignalGroup(w.pid, sig);
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
    AnswerStacks();
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

std::vector<DumpTarget> Agent::LiveTargets() const {
  std::vector<DumpTarget> targets;
  for (const Worker& w : workers_) {
    if (w.alive) targets.push_back({w.rank, w.local_rank, w.pid});
  }
  return targets;
}

std::optional<Agent::Capture> Agent::CaptureBeforeKill(bool telling, const std::string& why) {
  if (!options_.dump_stacks || options_.capture_before_kill == CaptureMode::kOff) return {};
  if (options_.capture_before_kill == CaptureMode::kAuto && !telling) return {};
  const std::vector<DumpTarget> targets = LiveTargets();
  if (targets.empty()) return {};
  const SteadyTime t0 = clock_.Now();
  Capture c{options_.dump_stacks(targets, options_.capture_bound), 0, why};
  c.took_s = std::chrono::duration<double>(clock_.Now() - t0).count();
  return c;
}

std::shared_future<StackReport> Agent::KeepCapture(Capture c, int failed_rank,
                                                   std::string what) {
  std::string dir;
  if (!options_.run_dir.empty()) dir = absl::StrCat(options_.run_dir, "/attempt_", attempt_);
  auto keep = [this, c = std::move(c), dir, name = options_.name_frames, failed_rank,
               what = std::move(what), when = clock_.WallSeconds()]() mutable {
    if (name) name(&c.ranks);
    const size_t n = c.ranks.size();
    StackReport r = GroupStacks(std::move(c.ranks));
    r.took_s = c.took_s;
    std::string where = "not written (no run directory)";
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      std::ofstream(dir + "/" + kStacksJsonName) << StackReportJson(r, 2) << "\n";
      std::ofstream(dir + "/stacks.txt") << FormatStackReport(r);
      where = absl::StrCat("in ", dir, "/stacks.txt");
    }
    spdlog::info("stacks of {} live worker(s) before the stop ({}), read in {:.2f} s: {}; {}", n,
                 c.why, r.took_s,
                 r.suspects.empty() ? std::string("no suspects")
                                    : absl::StrCat("suspects: ranks ", RankRanges(r.suspects)),
                 where);
    if (failed_rank >= 0) {
      if (const std::string others = WhereTheOthersWere(r, failed_rank); !others.empty()) {
        spdlog::warn("{}; {}", what, others);
      }
    }
    // The live page and /api/job (through this node's next publication).
    telemetry_.SetStacks(StackSummaryJson(r, options_.hostname, c.why, when,
                                          rdzv::kMaxTelemetryStacksBytes));
    return r;
  };
  std::shared_future<StackReport> f = std::async(std::launch::async, std::move(keep)).share();
  captures_.push_back(f);
  return f;
}

void Agent::AnswerStacks() {
  PostNamedStacks(std::chrono::seconds(0));
  const uint64_t id = source_->StacksWanted();
  if (id == 0 || answering_) return;
  // The dump itself here (milliseconds: py-spy reads without stopping, eu-stack only unwinds);
  // naming native frames can take seconds, during which this loop must go on heartbeating, so
  // it runs on a thread of its own and the answer goes with a later check.
  const std::vector<DumpTarget> targets = LiveTargets();
  std::vector<RankStack> ranks;
  if (options_.dump_stacks && !targets.empty()) {
    ranks = options_.dump_stacks(targets, defaults::kStacksBound);
  }
  answering_.emplace(id, std::async(std::launch::async,
                                    [ranks = std::move(ranks), name = options_.name_frames]() mutable {
                                      if (name) name(&ranks);
                                      // The rendezvous takes at most 64 KB from a node.
                                      return RankStacksJson(std::move(ranks), 60 * 1024);
                                    }));
  // Python frames come named: most answers are ready at once and go now, not a check later.
  PostNamedStacks(std::chrono::seconds(1));
}

void Agent::PostNamedStacks(std::chrono::milliseconds wait) {
  // From this thread: the membership source's client is this thread's.
  if (answering_ && answering_->second.wait_for(wait) == std::future_status::ready) {
    source_->PostStacks(answering_->first, answering_->second.get());
    answering_.reset();
  }
}

std::shared_future<std::string> Agent::NameFaultingFrame(int rank, StackThread crash,
                                                         std::string* named) {
  const StackFrame& top = crash.frames.front();
  if (top.module.empty() || top.function != "??" || !options_.name_frames) {
    *named = top.Render();
    std::promise<std::string> ready;
    ready.set_value(*named);
    return ready.get_future().share();
  }
  // A native frame without a symbol: eu-addr2line names it, which can take seconds on a large
  // library; the restart does not wait, the report does.
  return std::async(std::launch::async, [rank, crash = std::move(crash),
                                         name = options_.name_frames]() mutable {
           std::vector<RankStack> ranks(1);
           ranks[0].rank = rank;
           ranks[0].tool = "eu-stack";
           ranks[0].threads.push_back(std::move(crash));
           name(&ranks);
           std::string frame = ranks[0].threads[0].frames.front().Render();
           spdlog::warn("rank {} crashed in {}", rank, frame);
           return frame;
         })
      .share();
}

std::string Agent::ReadFlightRecorder() const {
  if (options_.log_dir.empty()) return "";
  const std::string dir = absl::StrCat(AttemptLogDir(), "/", contract::kFrDir);
  std::vector<std::string> errors;
  const std::vector<FrRank> dumps = ReadFlightRecorderDir(dir, contract::kFrFilePrefix, &errors);
  for (const std::string& e : errors) spdlog::warn("flight recorder: cannot read {}", e);
  std::vector<int> expected;
  for (const Worker& w : workers_) expected.push_back(w.rank);
  const std::optional<FrVerdict> v = FirstDisagreement(dumps, expected);
  if (!v) return "";
  spdlog::warn("flight recorder: {} (dumps of {} rank(s) in {})", v->text, dumps.size(), dir);
  return FrVerdictJson(*v).dump();
}

int Agent::AfterFailure() {
  // Is the first failure one whose stacks tell something (--capture-before-kill auto)? Not a
  // plain exception whose traceback is in its error file.
  bool telling = true;
  for (const WorkerExit& e : exits_) {
    if (!e.failed() || e.stopped) continue;
    if (e.signal == 0) {
      const ErrorRecord rec = ReadErrorRecord(ErrorFile(e.local_rank));
      const FailureClass c =
          ClassifyFailure(e, absl::StrCat(rec.message, "\n", rec.traceback), false).cls;
      telling = rec.traceback.empty() || c == FailureClass::kCollectiveTimeout ||
                c == FailureClass::kPeerLost;
    }
    break;
  }
  std::optional<Capture> capture = CaptureBeforeKill(telling, "a worker failed");
  StopGroup(SIGTERM);
  // Each failed worker's error file, read once for the root cause and the report.
  std::map<int, ErrorRecord> records;
  for (const WorkerExit& e : exits_) {
    if (e.failed() && !e.stopped) records[e.local_rank] = ReadErrorRecord(ErrorFile(e.local_rank));
  }
  auto error_of = [&records](int lr) {
    auto it = records.find(lr);
    return it == records.end() ? ErrorRecord{} : it->second;
  };
  telemetry_.MaybePublish(/*now_anyway=*/true);
  const RootCause root = PickRootCause(exits_, error_of);
  const WorkerExit& first = root.exit;
  // What kind of failure: from what the worker left, and the memory cgroup's OOM kills.
  const int64_t oom_kills = processes_.OomKills();
  const bool oom_killed =
      oom_kills >= 0 && oom_kills_at_spawn_ >= 0 && oom_kills > oom_kills_at_spawn_;
  auto class_of = [&](const WorkerExit& e) {
    const ErrorRecord rec = error_of(e.local_rank);
    return ClassifyFailure(
        e, absl::StrCat(rec.message, "\n", rec.traceback, "\n", processes_.ErrorTail(e.pid)),
        oom_killed);
  };
  const Classification cls = class_of(first);
  // A crash: the frame it died in, from the stack it wrote on its way down (crash_trace.h).
  std::string faulting;  // named already: Python's, or a symbol the library exported
  std::shared_future<std::string> faulting_frame;
  if (first.signal != 0) {
    if (auto t = ParseCrashTrace(processes_.ErrorTail(first.pid)); t && !t->frames.empty()) {
      faulting_frame = NameFaultingFrame(first.global_rank, *std::move(t), &faulting);
    }
  }
  // Without an error file, the worker's last stderr line says more than "exit code 1".
  std::string said = root.message;
  if (!faulting.empty()) {
    said = absl::StrCat(root.message, " at ", faulting);
  } else if (error_of(first.local_rank).message.empty() && !faulting_frame.valid()) {
    if (const std::string last = LastLine(processes_.ErrorTail(first.pid)); !last.empty()) {
      said = absl::StrCat(root.message, ": ", last);
    }
  }
  const std::string what =
      first.signal != 0
          ? absl::StrCat("rank ", first.global_rank, " got SIG", sigabbrev_np(first.signal),
                         faulting.empty() ? "" : " at ", faulting)
          : absl::StrCat("rank ", first.global_rank, " exited with ", first.exit_code);
  std::shared_future<std::string> stacks_json;
  if (capture) {
    std::shared_future<StackReport> kept =
        KeepCapture(*std::move(capture), first.global_rank, what);
    stacks_json = std::async(std::launch::deferred, [kept] {
                    return StackReportJson(kept.get());
                  }).share();
  }
  telemetry_.NoteFailure({first.global_rank, options_.hostname, FailureClassName(cls.cls), said,
                          stacks_json, ReadFlightRecorder(), faulting_frame});
  // A failure that repeats the last one the same way would only repeat again: the job ends
  // here instead of spending every restart on it.
  const FailureSignature signature{cls.cls, first.global_rank,
                                   telemetry_.LastStep(first.global_rank),
                                   said.substr(0, said.find('\n'))};
  const bool repeated = last_failure_ && RepeatsTheLast(*last_failure_, signature);
  last_failure_ = signature;
  if (repeated) {
    spdlog::error("rank {} failed the same way twice ({}{}): not restarting, a restart would "
                  "repeat it",
                  first.global_rank, FailureClassName(cls.cls),
                  signature.step >= 0 ? absl::StrCat(" at step ", signature.step)
                                      : std::string(" before its first step"));
    source_->OnFatalFailure(absl::StrCat(what, ", the same way as the attempt before"));
  } else if (source_->OnFailure(what)) {
    // An attempt that is followed by a restart is one line; the failure block and "job failed"
    // come once, when the job ends failed (as torchrun), so a log grep for them means the end.
    spdlog::warn("rank {} (local rank {}, pid {}) [{}]: {}; restarting {} of {}",
                 first.global_rank, first.local_rank, first.pid, FailureClassName(cls.cls),
                 said.substr(0, said.find('\n')),
                 current_.restart_count + 1,
                 current_.max_restarts);
    return -1;
  }
  FailureReport report{options_.program_name, options_.hostname, exits_, root,
                       [this](int lr) { return ErrorFile(lr); }, error_of, class_of};
  std::fflush(stdout);
  std::fputs(FormatFailureReport(report).c_str(), stderr);
  spdlog::error("job failed. Root cause (first failure): rank {} (local rank {}, pid {}): {}",
                first.global_rank, first.local_rank, first.pid, root.message);
  if (const std::string advice = FailureAdvice(cls.cls); !advice.empty()) {
    spdlog::warn("{}: {}", FailureClassName(cls.cls), advice);
  }
  return options_.exit_with_worker_code ? first.code() : 1;
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
  for (const auto& c : captures_) c.wait();  // their files and lines before the end
  telemetry_.Finish(rc, clock_.WallSeconds() - start, current_);
  FinishRunDir(rc);
  return rc;
}

// After the run: a kept log directory is named; the scratch directory holds only the workers'
// error files and is kept (and named) only when a failed job left any.
void Agent::FinishRunDir(int rc) const {
  const std::string& run_dir = options_.run_dir;
  if (run_dir.empty()) return;
  if (options_.keep_run_dir) {
    spdlog::info("worker logs are in {}", run_dir);
    return;
  }
  std::error_code ec;
  bool any = false;
  for (auto it = std::filesystem::recursive_directory_iterator(run_dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) && (it->path().filename() == contract::kErrorFileName ||
                                    it->path().filename() == kStacksJsonName)) {
      any = true;
    }
  }
  if (rc != 0 && any) {
    spdlog::info("worker error files are kept in {}", run_dir);
  } else {
    std::filesystem::remove_all(run_dir, ec);
  }
}

int Agent::RunAttempts() {
  for (;; ++attempt_) {
    exits_.clear();
    int sig = 0;
    absl::StatusOr<Assignment> next = NextAssignment(&sig);
    if (sig != 0) {
      spdlog::warn("received SIG{} while joining the rendezvous: exiting", sigabbrev_np(sig));
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
    std::optional<Capture> capture;
    int rc = -1;
    switch (w.outcome) {
      case Watch::Outcome::kSucceeded:
        rc = AfterSuccess();
        break;
      case Watch::Outcome::kFailed:
        rc = AfterFailure();
        break;
      case Watch::Outcome::kHung:
        spdlog::error("{}: stopping the worker group", w.reason);
        capture = CaptureBeforeKill(/*telling=*/true, "a hang");
        StopGroup(SIGTERM);
        if (capture) KeepCapture(*std::move(capture));
        telemetry_.MaybePublish(/*now_anyway=*/true);
        if (!source_->OnFailure(w.reason)) return kHangExitCode;
        spdlog::warn("restarting worker group after a hang");
        break;
      case Watch::Outcome::kSignalled:
        spdlog::warn("received SIG{}: forwarding to workers and stopping", sigabbrev_np(w.signal));
        StopGroup(w.signal);
        // The steps done since the last period's publication belong in the report too.
        telemetry_.MaybePublish(/*now_anyway=*/true, /*all_steps=*/true);
        source_->OnStop(absl::StrCat("agent received SIG", sigabbrev_np(w.signal)));
        return 128 + w.signal;
      case Watch::Outcome::kRestart:
        spdlog::warn("the rendezvous opened a new round ({}): restarting workers", w.reason);
        capture = CaptureBeforeKill(/*telling=*/true,
                                    "a new round: another node failed or was lost");
        StopGroup(SIGTERM);
        if (capture) KeepCapture(*std::move(capture));
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
