// The agent's failure path (agent.h): what a failure was (its root cause, its class, with
// forensics.h's capture, faulting frame and Flight Recorder verdict) and whether to restart.
// The rest of the agent's loop is in agent.cc.
#include <signal.h>
#include <string.h>

#include <cstdio>
#include <ctime>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "common/signal_name.h"
#include "launcher/agent/agent.h"
#include "launcher/base/bad_nodes.h"
#include "launcher/stacks/crash_trace.h"
#include "launcher/stacks/stacks.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

std::vector<DumpTarget> Agent::LiveTargets() const {
  std::vector<DumpTarget> targets;
  for (const Worker& w : workers_) {
    if (w.alive) targets.push_back({w.rank, w.local_rank, w.pid});
  }
  return targets;
}

std::vector<int> Agent::Ranks() const {
  std::vector<int> ranks;
  for (const Worker& w : workers_) ranks.push_back(w.rank);
  return ranks;
}

void Agent::StopWithCapture(const std::string& why) {
  std::optional<Forensics::Capture> capture =
      forensics_.CaptureBeforeKill(LiveTargets(), /*telling=*/true, why);
  StopGroup(SIGTERM);
  if (capture) forensics_.FinishCapture(*std::move(capture), attempt_);
}

void Agent::NoteHardwareFault(const std::string& what) {
  if (++hardware_faults_ != 2) return;
  const BadNode bad{options_.hostname, static_cast<int64_t>(std::time(nullptr)),
                    absl::StrCat("workers failed twice with a hardware fault, the last ", what)};
  RecordBadNode(*options_.file_system, options_.bad_nodes_files, bad);
  spdlog::warn("this node ({}) goes into the bad-node list: its workers failed twice with a "
               "hardware fault, the last {} (`dlrun slurm` excludes it; `dlrun bad-nodes "
               "--clear {}` forgets it)",
               options_.hostname, what, options_.hostname);
}

bool Agent::RepeatsLastFailure(const FailureSignature& now) {
  const bool repeated = last_failure_ && RepeatsTheLast(*last_failure_, now);
  last_failure_ = now;
  return repeated;
}

bool Agent::FirstFailureTells() const {
  for (const WorkerExit& e : exits_) {
    if (!e.failed() || e.stopped) continue;
    if (e.signal != 0) return true;
    const ErrorRecord rec = run_dir_.ReadErrorRecord(attempt_, e.local_rank);
    const FailureClass c =
        ClassifyFailure(e, absl::StrCat(rec.message, "\n", rec.traceback), false).cls;
    return rec.traceback.empty() || c == FailureClass::kCollectiveTimeout ||
           c == FailureClass::kPeerLost;
  }
  return true;
}

Agent::FailureDescription Agent::DescribeFailure(const RootCause& root, bool has_error_file) {
  const WorkerExit& first = root.exit;
  FailureDescription w;
  // A crash: the frame it died in, from the stack it wrote on its way down (crash_trace.h).
  std::string faulting;  // named already: Python's, or a symbol the library exported
  if (first.signal != 0) {
    if (auto t = ParseCrashTrace(processes_.ErrorTail(first.pid)); t && !t->frames.empty()) {
      w.faulting_frame = forensics_.NameFaultingFrame(first.global_rank, *std::move(t), &faulting);
    }
  }
  // Without an error file, the worker's last stderr line says more than "exit code 1".
  w.message = root.message;
  if (!faulting.empty()) {
    w.message = absl::StrCat(root.message, " at ", faulting);
  } else if (!has_error_file && !w.faulting_frame.valid()) {
    if (const std::string last = LastLine(processes_.ErrorTail(first.pid)); !last.empty()) {
      w.message = absl::StrCat(root.message, ": ", last);
    }
  }
  w.cause = first.signal != 0
               ? absl::StrCat("rank ", first.global_rank, " got SIG",
                              dlrun::SignalAbbrev(first.signal), faulting.empty() ? "" : " at ",
                              faulting)
               : absl::StrCat("rank ", first.global_rank, " exited with ", first.exit_code);
  if (const std::string from = recovery_.recovering_from(); !from.empty()) {
    // A failure during an in-process recovery: the restart's cause is the fault the recovery
    // began with (it said "rank 0 exited with 1", the survivor that refused, as the cause).
    w.cause = absl::StrCat(from, ", and the in-process recovery after it failed (",
                           w.cause, ")");
  }
  return w;
}

int Agent::AfterFailure() {
  // Is the first failure one whose stacks tell something (--capture-before-kill auto)?
  const bool telling = FirstFailureTells();
  std::optional<Forensics::Capture> capture =
      forensics_.CaptureBeforeKill(LiveTargets(), telling, "a worker failed");
  StopGroup(SIGTERM);
  // Each failed worker's error file, read once for the root cause and the report.
  std::map<int, ErrorRecord> records;
  for (const WorkerExit& e : exits_) {
    if (e.failed() && !e.stopped) records[e.local_rank] = run_dir_.ReadErrorRecord(attempt_, e.local_rank);
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
  auto text_of = [&](const WorkerExit& e) {
    const ErrorRecord rec = error_of(e.local_rank);
    return absl::StrCat(rec.message, "\n", rec.traceback, "\n", processes_.ErrorTail(e.pid));
  };
  auto class_of = [&](const WorkerExit& e) { return ClassifyFailure(e, text_of(e), oom_killed); };
  const Classification cls = class_of(first);
  if (const std::string hw = HardwareFault(cls, text_of(first)); !hw.empty()) {
    NoteHardwareFault(hw);
  }
  const FailureDescription failure =
      DescribeFailure(root, !error_of(first.local_rank).message.empty());
  const std::string& message = failure.message;
  const std::string& cause = failure.cause;
  std::shared_future<std::string> stacks_json;
  if (capture) {
    stacks_json = Forensics::JsonWhenRead(
        forensics_.FinishCapture(*std::move(capture), attempt_, first.global_rank, cause));
  }
  telemetry_.NoteFailure({first.global_rank, options_.hostname, FailureClassName(cls.cls), message,
                          stacks_json, forensics_.ReadFlightRecorder(attempt_, Ranks()),
                          failure.faulting_frame});
  // A failure that repeats the last one the same way would only repeat again: the job ends
  // here instead of spending every restart on it.
  const FailureSignature signature{cls.cls, first.global_rank,
                                   telemetry_.LastStep(first.global_rank),
                                   message.substr(0, message.find('\n'))};
  if (RepeatsLastFailure(signature)) {
    spdlog::error("rank {} failed the same way twice ({}{}): not restarting, a restart would "
                  "repeat it",
                  first.global_rank, FailureClassName(cls.cls),
                  signature.step >= 0
                      ? absl::StrCat(" after step ", signature.step, ", its last reported")
                                      : std::string(" before its first step"));
    source_->OnFailure(absl::StrCat(cause, ", the same way as the attempt before"), true);
  } else if (source_->OnFailure(cause, false)) {
    // An attempt that is followed by a restart is one line; the failure block and "job failed"
    // come once, when the job ends failed (as torchrun), so a log grep for them means the end.
    spdlog::warn("rank {} (local rank {}, pid {}) [{}]: {}; restarting {} of {}",
                 first.global_rank, first.local_rank, first.pid, FailureClassName(cls.cls),
                 message.substr(0, message.find('\n')),
                 current_.restart_count + 1,
                 current_.max_restarts);
    return -1;
  }
  FailureReport report{options_.program_name, options_.hostname, exits_, root,
                       [this](int lr) { return run_dir_.ErrorFile(attempt_, lr); }, error_of, class_of};
  std::fflush(stdout);
  std::fputs(FormatFailureReport(report).c_str(), stderr);
  // Its first line, as the restart line has it (a SyntaxError's, not only "exit code 1").
  spdlog::error("job failed. Root cause (first failure): rank {} (local rank {}, pid {}): {}",
                first.global_rank, first.local_rank, first.pid,
                message.substr(0, message.find('\n')));
  if (const std::string advice = FailureAdvice(cls.cls); !advice.empty()) {
    spdlog::warn("{}: {}", FailureClassName(cls.cls), advice);
  }
  return options_.exit_with_worker_code ? first.code() : 1;
}

}  // namespace dlrun::launcher
