// The failure and hang paths (failure_policy.h): a failure's root cause, class, capture and
// report; a hang named from every rank's stack before the group is stopped, that one name in
// the log line, the capture's suspects, the restart and --report-json alike.
#include "launcher/agent/failure_policy.h"

#include <signal.h>

#include <cstdio>
#include <ctime>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/signal_name.h"
#include "launcher/base/bad_nodes.h"
#include "launcher/stacks/crash_trace.h"
#include "launcher/stacks/stacks.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

void FailurePolicy::StopWithCapture(const std::string& why) {
  std::optional<Forensics::Capture> capture = s_.forensics.CaptureBeforeKill(
      DumpTargets(s_.group.workers(), /*live_only=*/true), /*telling=*/true, why);
  s_.stop_group(SIGTERM);
  if (capture) s_.forensics.FinishCapture(*std::move(capture), s_.group.attempt());
}

void FailurePolicy::NoteHardwareFault(const std::string& what) {
  if (++hardware_faults_ != 2) return;
  const BadNode bad{s_.options.hostname, static_cast<int64_t>(std::time(nullptr)),
                    absl::StrCat("workers failed twice with a hardware fault, the last ", what)};
  RecordBadNode(*s_.options.file_system, s_.options.bad_nodes_files, bad);
  spdlog::warn(
      "this node ({}) goes into the bad-node list: its workers failed twice with a "
      "hardware fault, the last {} (`dlrun slurm` excludes it; `dlrun bad-nodes "
      "--clear {}` forgets it)",
      s_.options.hostname, what, s_.options.hostname);
}

bool FailurePolicy::FirstFailureTells() const {
  for (const WorkerExit& e : s_.group.exits()) {
    if (!e.failed() || e.stopped) continue;
    const ErrorRecord rec = s_.run_dir.ReadErrorRecord(s_.group.attempt(), e.local_rank);
    const FailureClass c =
        ClassifyFailure(e, absl::StrCat(rec.message, "\n", rec.traceback), false).cls;
    return FailureVerdict::StacksTell(e, rec, c);
  }
  return true;
}

FailurePolicy::Description FailurePolicy::Describe(const RootCause& root, bool has_error_file,
                                                   const std::string& recovering_from) {
  const WorkerExit& first = root.exit;
  Description w;
  // A crash: the frame it died in, from the stack it wrote on its way down (crash_trace.h).
  std::string faulting;  // named already: Python's, or a symbol the library exported
  if (first.signal != 0) {
    if (auto t = ParseCrashTrace(s_.processes.ErrorTail(first.pid)); t && !t->frames.empty()) {
      w.faulting_frame =
          s_.forensics.NameFaultingFrame(first.global_rank, *std::move(t), &faulting);
    }
  }
  // Without an error file, the worker's last stderr line says more than "exit code 1".
  w.message = root.message;
  if (!faulting.empty()) {
    w.message = absl::StrCat(root.message, " at ", faulting);
  } else if (!has_error_file && !w.faulting_frame.valid()) {
    if (const std::string last = LastLine(s_.processes.ErrorTail(first.pid)); !last.empty()) {
      w.message = absl::StrCat(root.message, ": ", last);
    }
  }
  w.cause =
      first.signal != 0
          ? absl::StrCat("rank ", first.global_rank, " got SIG", dlrun::SignalAbbrev(first.signal),
                         faulting.empty() ? "" : " at ", faulting)
          : absl::StrCat("rank ", first.global_rank, " exited with ", first.exit_code);
  if (const std::string& from = recovering_from; !from.empty()) {
    // A failure during an in-process recovery: the restart's cause is the fault the recovery
    // began with (it said "rank 0 exited with 1", the survivor that refused, as the cause).
    w.cause = absl::StrCat(from, ", and the in-process recovery after it failed (", w.cause, ")");
  }
  return w;
}

std::map<int, ErrorRecord> FailurePolicy::FailedRecords() const {
  std::map<int, ErrorRecord> records;
  for (const WorkerExit& e : s_.group.exits()) {
    if (e.failed() && !e.stopped) {
      records[e.local_rank] = s_.run_dir.ReadErrorRecord(s_.group.attempt(), e.local_rank);
    }
  }
  return records;
}

int FailurePolicy::AfterFailure(const std::string& recovering_from, bool in_process) {
  // Is the first failure one whose stacks tell something (--capture-before-kill auto)?
  const bool telling = FirstFailureTells();
  std::optional<Forensics::Capture> capture = s_.forensics.CaptureBeforeKill(
      DumpTargets(s_.group.workers(), /*live_only=*/true), telling, "a worker failed");
  s_.stop_group(SIGTERM);
  const std::map<int, ErrorRecord> records = FailedRecords();
  auto error_of = [&records](int lr) {
    auto it = records.find(lr);
    return it == records.end() ? ErrorRecord{} : it->second;
  };
  s_.telemetry.MaybePublish(/*now_anyway=*/true);
  const RootCause root = PickRootCause(s_.group.exits(), error_of);
  const WorkerExit& first = root.exit;
  // What kind of failure: from what the worker left, and the memory cgroup's OOM kills.
  const bool oom_killed = s_.group.OomKilled();
  auto text_of = [&](const WorkerExit& e) {
    const ErrorRecord rec = error_of(e.local_rank);
    return absl::StrCat(rec.message, "\n", rec.traceback, "\n", s_.processes.ErrorTail(e.pid));
  };
  auto class_of = [&](const WorkerExit& e) { return ClassifyFailure(e, text_of(e), oom_killed); };
  const Classification cls = class_of(first);
  if (const std::string hw = HardwareFault(cls, text_of(first)); !hw.empty()) {
    NoteHardwareFault(hw);
  }
  const Description failure =
      Describe(root, !error_of(first.local_rank).message.empty(), recovering_from);
  const std::string& message = failure.message;
  const std::string& cause = failure.cause;
  std::shared_future<std::string> stacks_json;
  if (capture) {
    stacks_json = Forensics::JsonWhenRead(s_.forensics.FinishCapture(
        *std::move(capture), s_.group.attempt(), first.global_rank, cause));
  }
  s_.telemetry.NoteFailure(
      {first.global_rank, s_.options.hostname, FailureClassName(cls.cls), message, stacks_json,
       s_.forensics.ReadFlightRecorder(s_.group.attempt(), RanksOf(s_.group.workers())),
       failure.faulting_frame, cause});
  // A failure that repeats the last one the same way would only repeat again: the job ends
  // here instead of spending every restart on it.
  const FailureSignature signature{cls.cls, first.global_rank,
                                   s_.telemetry.steps().LastStep(first.global_rank),
                                   message.substr(0, message.find('\n'))};
  if (Restarts(signature, cause, first, FailureClassName(cls.cls), in_process)) return -1;
  FailureReport report{s_.options.program_name,
                       s_.options.hostname,
                       s_.group.exits(),
                       root,
                       [this](int lr) { return s_.run_dir.ErrorFile(s_.group.attempt(), lr); },
                       error_of,
                       class_of};
  std::fflush(stdout);
  std::fputs(FormatFailureReport(report).c_str(), stderr);
  // Its first line, as the restart line has it (a SyntaxError's, not only "exit code 1").
  spdlog::error("job failed. Root cause (first failure): rank {} (local rank {}, pid {}): {}",
                first.global_rank, first.local_rank, first.pid,
                message.substr(0, message.find('\n')));
  if (const std::string advice = FailureAdvice(cls.cls); !advice.empty()) {
    spdlog::warn("{}: {}", FailureClassName(cls.cls), advice);
  }
  return FailureVerdict::ExitCode(s_.options.exit_with_worker_code, first);
}

bool FailurePolicy::Restarts(const FailureSignature& signature, const std::string& cause,
                             const WorkerExit& first, const char* class_name,
                             bool in_process) {
  const std::string& message = signature.message;
  switch (verdict_.Decide({signature, in_process, AllDeclared(s_.group.workers())})) {
    case FailureVerdict::Route::kEndRepeated:
      spdlog::error(
          "rank {} failed the same way twice ({}{}): not restarting, a restart would "
          "repeat it",
          first.global_rank, class_name,
          signature.step >= 0 ? absl::StrCat(" after step ", signature.step, ", its last reported")
                              : std::string(" before its first step"));
      s_.source.OnFailure(absl::StrCat(cause, ", the same way as the attempt before"), true);
      return false;
    case FailureVerdict::Route::kFallBack:
      // A program that declared in-process recovery: its restart from the checkpoint, once per
      // fault, is not counted against --max-restarts (the recovery it replaces was the plan).
      if (!s_.source.OnFallback(cause)) return false;
      spdlog::warn("rank {} (local rank {}, pid {}) [{}]: {}; restarting from the checkpoint in "
                   "place of the in-process recovery (not counted against --max-restarts)",
                   first.global_rank, first.local_rank, first.pid, class_name, message);
      return true;
    case FailureVerdict::Route::kCounted:
      if (!s_.source.OnFailure(cause, false)) return false;
      // An attempt that is followed by a restart is one line; the failure block and "job
      // failed" come once, when the job ends failed (as torchrun), so a log grep for them
      // means the end.
      spdlog::warn("rank {} (local rank {}, pid {}) [{}]: {}; restarting {} of {}",
                   first.global_rank, first.local_rank, first.pid, class_name, message,
                   s_.group.current().restart_count + 1, s_.group.current().max_restarts);
      return true;
  }
  return false;
}

pid_t FailurePolicy::HungAlone(const std::vector<int>& culprits) const {
  if (culprits.size() != 1 || !AllDeclared(s_.group.workers())) return -1;
  for (const WorkerGroup::Worker& w : s_.group.workers()) {
    if (w.rank == culprits[0] && w.alive) return w.pid;
  }
  return -1;
}

void FailurePolicy::NoteHang(int culprit, const std::string& message,
                             std::optional<Forensics::Capture> capture,
                             const std::vector<int>& culprits) {
  std::shared_future<std::string> stacks_json;
  if (capture) {
    stacks_json = Forensics::JsonWhenRead(
        s_.forensics.FinishCapture(*std::move(capture), s_.group.attempt(), -1, "", culprits));
  }
  s_.telemetry.MaybePublish(/*now_anyway=*/true);
  s_.telemetry.NoteFailure(
      {culprit,
       s_.options.hostname,
       FailureClassName(FailureClass::kHang),
       message,
       stacks_json,
       s_.forensics.ReadFlightRecorder(s_.group.attempt(), RanksOf(s_.group.workers())),
       {},
       message});
}

HangVerdict FailurePolicy::WhereRanksAre() {
  if (!s_.options.dump_stacks) return {};
  const std::vector<int> stopped = s_.group.StoppedRanks();
  return NameHung(
      GroupStacks(s_.options.dump_stacks(DumpTargets(s_.group.workers(), /*live_only=*/true),
                                         s_.options.capture_bound)),
      stopped);
}

std::optional<FailurePolicy::Hung> FailurePolicy::CheckHangs(SteadyTime* next) {
  const HangOptions& o = s_.options.hang;
  const SteadyTime now = s_.clock.Now();
  if (now >= next_cpu_) {
    const AgentTelemetry::CpuUse cpu = s_.telemetry.Cpu();
    hang_.Cpu(cpu.cores, now, s_.telemetry.GpuUtilizationMax(), cpu.busy_off_cpu);
    next_cpu_ = now + defaults::kTelemetryWindow;
  }
  const double timeout_s = std::chrono::duration<double>(o.timeout).count();
  const bool sampled = s_.options.telemetry.on && s_.options.telemetry.sample_processes;
  if (hang_.TimeoutNeverArmed(now)) {
    const std::string what =
        sampled ? absl::StrFormat(
                      "so the timeout applies only to the whole group idle (every "
                      "rank under %g of a core) that long; for a per-rank timeout,",
                      o.idle_cores)
                : std::string(
                      "and with --telemetry off nothing samples their CPU use, so it "
                      "cannot take effect;");
    spdlog::warn(
        "--hang-timeout {:g} s: no rank has sent a heartbeat or step record in its "
        "first {:g} s, {} call dlrun_report.heartbeat() (Python) or "
        "dlrun::worker::heartbeat() (C++) each step",
        timeout_s, timeout_s, what);
  }
  std::optional<HangWatch::Hung> hung = hang_.Check(now, next);
  *next = std::min(*next, next_cpu_);
  if (hung) {
    for (const WorkerGroup::Worker& w : s_.group.workers()) {
      if (w.pid == hung->pid) return Hung{hung->why, w.rank};
    }
  }
  if (!hang_.IdleWorthALine(now)) return std::nullopt;
  hang_.MarkIdleReported();
  const std::string idle = absl::StrFormat(
      "every rank has used under %g of a core for %.0f s", o.idle_cores,
      std::chrono::duration<double>(hang_.IdleFor(now).value_or(Millis(0))).count());
  if (hang_.IdleIsHang(now)) return Hung{idle, -1};
  const HangVerdict v = WhereRanksAre();
  spdlog::warn(
      "{}{}{}; it may be hung (--hang-timeout S stops and restarts a group idle that "
      "long)",
      idle, v.where.empty() ? "" : ": ", v.where);
  return std::nullopt;
}

namespace {
// HoldersBySyscall over the live workers of `group` (stacks.h).
std::vector<int> HoldersByCall(const WorkerGroup& group, const ProcessFacts& facts) {
  std::map<int, std::string> calls;
  for (const WorkerGroup::Worker& w : group.workers()) {
    if (w.alive) calls[w.rank] = facts.BlockedCall(w.pid);
  }
  return HoldersBySyscall(calls);
}
}  // namespace

int FailurePolicy::AfterHang(const Hung& hung, bool in_process) {
  const std::string& reason = hung.reason;
  const int rank = hung.rank;
  const std::vector<int> stopped = s_.group.StoppedRanks();
  std::optional<Forensics::Capture> capture = s_.forensics.CaptureBeforeKill(
      DumpTargets(s_.group.workers(), /*live_only=*/true), /*telling=*/true, "a hang");
  HangVerdict v;
  if (capture) {
    v = NameHung(GroupStacks(capture->ranks), stopped);
  } else {
    v.culprits = stopped;
  }
  std::vector<int> culprits = v.culprits;
  // No stack read names one (no py-spy): the system call each main thread is blocked in may.
  if (culprits.empty() && !v.all_wait) {
    culprits = HoldersByCall(s_.group, s_.processes.facts());
    if (!culprits.empty()) {
      v.where += absl::StrCat(v.where.empty() ? "" : "; ", RanksPhrase(culprits),
                              culprits.size() == 1 ? "'s" : "'", " main thread is in ",
                              "its own work, the others' wait on their communication threads (by "
                              "the system calls they are blocked in)");
    }
  }
  // Every rank here waits in a collective: the one holding them up is not on this node.
  if (culprits.empty() && rank >= 0 && !v.all_wait) culprits = {rank};
  const std::string who =
      culprits.empty() ? absl::StrCat("the group (", RanksPhrase(RanksOf(s_.group.workers())), ")")
                       : RanksPhrase(culprits);
  const std::string detected = rank < 0 || (culprits.size() == 1 && culprits[0] == rank)
                                   ? reason
                                   : absl::StrCat("rank ", rank, ": ", reason);
  // With every rank of the group here, none is on another node: they wait on each other.
  const std::vector<WorkerGroup::Worker>& workers = s_.group.workers();
  const bool whole_group_here = s_.group.current().world_size == static_cast<int>(workers.size());
  const std::string message = absl::StrCat(
      who, " hung: ", detected,
      !v.all_wait ? ""
      : whole_group_here
          ? "; every rank waits in a collective, and every rank of the job is on this node: "
            "they wait on each other (a collective that some ranks do not call, or call in "
            "another order or with other sizes)"
          : "; every rank on this node waits in a collective: the rank holding them up is on "
            "another node, or gone",
      v.where.empty() ? "" : "; ", v.where);
  const pid_t alone = in_process ? HungAlone(culprits) : -1;
  spdlog::error("{}: {}", message,
                alone > 0 ? "killing it; the other ranks keep running (in-process recovery)"
                          : "stopping the worker group");
  if (alone > 0) {
    s_.processes.SignalGroup(alone, SIGKILL);  // its exit is the failure recovered in process
    hang_.Exited(alone);                       // judged: not hung again before its exit is seen
    // The others waited on it: their step records start again after the recovery, judged anew.
    for (const WorkerGroup::Worker& w : workers) {
      if (w.alive && w.pid != alone) hang_.Add(w.pid);
    }
  } else {
    s_.stop_group(SIGTERM);
  }
  const int culprit = culprits.empty() ? (workers.empty() ? 0 : workers[0].rank) : culprits[0];
  NoteHang(culprit, message, std::move(capture), culprits);
  if (alone > 0) return kRecoverInProcess;
  const FailureSignature signature{FailureClass::kHang, culprit,
                                   s_.telemetry.steps().LastStep(culprit), who};
  if (verdict_.Decide({signature, in_process, AllDeclared(s_.group.workers())}) ==
      FailureVerdict::Route::kEndRepeated) {
    spdlog::error("{} hung the same way twice ({}): not restarting, a restart would repeat it", who,
                  signature.step >= 0
                      ? absl::StrCat("after step ", signature.step, ", its last reported")
                      : std::string("before its first step"));
    s_.source.OnFailure(absl::StrCat(message, ", the same way as the attempt before"), true);
  } else if (s_.source.OnFailure(message, false)) {
    spdlog::warn("restarting the worker group after a hang: {} of {}",
                 s_.group.current().restart_count + 1, s_.group.current().max_restarts);
    return -1;
  }
  spdlog::error("job failed. Root cause (first failure): {}", message);
  spdlog::warn("hang: {}", FailureAdvice(FailureClass::kHang));
  return kHangExitCode;
}

}  // namespace dlrun::launcher
