// The agent's failure path (agent.h): the capture before kill, the job-wide stacks answer, what
// a failure was (its class, its faulting frame, the Flight Recorder's verdict), and whether to
// restart. The rest of the agent's loop is in agent.cc.
#include <signal.h>
#include <string.h>

#include <cstdio>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "launcher/agent/agent.h"
#include "launcher/profile/live_profile.h"
#include "launcher/stacks/crash_trace.h"
#include "launcher/stacks/flight_recorder.h"
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

std::shared_future<StackReport> Agent::FinishCapture(Capture c, int failed_rank,
                                                   std::string what) {
  auto keep = [this, c = std::move(c), attempt = attempt_, name = options_.name_frames, failed_rank,
               what = std::move(what), when = clock_.WallSeconds()]() mutable {
    if (name) name(&c.ranks);
    const size_t n = c.ranks.size();
    StackReport r = GroupStacks(std::move(c.ranks));
    r.took_s = c.took_s;
    const std::string where = run_dir_.WriteStacks(attempt, r);
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
                                          telemetry::kMaxTelemetryStacksBytes));
    return r;
  };
  std::shared_future<StackReport> f = std::async(std::launch::async, std::move(keep)).share();
  captures_.push_back(f);
  return f;
}

void Agent::AnswerStacks() {
  PostNamedStacks(std::chrono::seconds(0));
  JobChannel::Wanted wanted = channel_->DiagnosticsWanted();
  const uint64_t id = wanted.id;
  if (id == 0 || answering_) return;
  if (std::optional<rdzv::ProfileAsk> ask = std::move(wanted.profile)) {
    // `dlrun profile`: the capture lasts its duration; a later check posts the answer.
    answering_.emplace(id, std::async(std::launch::async,
                                      [ask = *std::move(ask), targets = LiveTargets(),
                                       run = options_.live_profile] {
                                        return run ? run(ask, targets) : std::string("[]");
                                      }));
    answering_profile_ = true;
    return;
  }
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
    const std::string answer = answering_->second.get();
    channel_->PostDiagnostics(answering_->first, answer);
    answering_.reset();
    if (answering_profile_) {  // also on the live page and in the report, by rank
      answering_profile_ = false;
      if (auto got = LiveProfilesFromJson(answer); got.ok()) {
        for (telemetry::RankProfile& p : *got) {
          if (p.path.empty()) continue;
          std::erase_if(live_profiles_, [&](const telemetry::RankProfile& q) { return q.rank == p.rank; });
          live_profiles_.push_back(std::move(p));
        }
        PublishProfiles();
      }
    }
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
  const std::string dir = run_dir_.FlightRecorderDir(attempt_);
  std::vector<std::string> errors;
  const std::vector<FrRank> dumps = run_dir_.ReadFlightRecorder(attempt_, &errors);
  for (const std::string& e : errors) spdlog::warn("flight recorder: cannot read {}", e);
  std::vector<int> expected;
  for (const Worker& w : workers_) expected.push_back(w.rank);
  const std::optional<FrVerdict> v = FirstDisagreement(dumps, expected);
  if (!v) return "";
  spdlog::warn("flight recorder: {} (dumps of {} rank(s) in {})", v->text, dumps.size(), dir);
  return FrVerdictJson(*v).dump();
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
      w.faulting_frame = NameFaultingFrame(first.global_rank, *std::move(t), &faulting);
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
               ? absl::StrCat("rank ", first.global_rank, " got SIG", sigabbrev_np(first.signal),
                              faulting.empty() ? "" : " at ", faulting)
               : absl::StrCat("rank ", first.global_rank, " exited with ", first.exit_code);
  return w;
}

int Agent::AfterFailure() {
  // Is the first failure one whose stacks tell something (--capture-before-kill auto)?
  const bool telling = FirstFailureTells();
  std::optional<Capture> capture = CaptureBeforeKill(telling, "a worker failed");
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
  auto class_of = [&](const WorkerExit& e) {
    const ErrorRecord rec = error_of(e.local_rank);
    return ClassifyFailure(
        e, absl::StrCat(rec.message, "\n", rec.traceback, "\n", processes_.ErrorTail(e.pid)),
        oom_killed);
  };
  const Classification cls = class_of(first);
  const FailureDescription failure = DescribeFailure(root, !error_of(first.local_rank).message.empty());
  const std::string& message = failure.message;
  const std::string& cause = failure.cause;
  std::shared_future<std::string> stacks_json;
  if (capture) {
    std::shared_future<StackReport> kept =
        FinishCapture(*std::move(capture), first.global_rank, cause);
    stacks_json = std::async(std::launch::deferred, [kept] {
                    return StackReportJson(kept.get());
                  }).share();
  }
  telemetry_.NoteFailure({first.global_rank, options_.hostname, FailureClassName(cls.cls), message,
                          stacks_json, ReadFlightRecorder(), failure.faulting_frame});
  // A failure that repeats the last one the same way would only repeat again: the job ends
  // here instead of spending every restart on it.
  const FailureSignature signature{cls.cls, first.global_rank,
                                   telemetry_.LastStep(first.global_rank),
                                   message.substr(0, message.find('\n'))};
  const bool repeated = last_failure_ && RepeatsTheLast(*last_failure_, signature);
  last_failure_ = signature;
  if (repeated) {
    spdlog::error("rank {} failed the same way twice ({}{}): not restarting, a restart would "
                  "repeat it",
                  first.global_rank, FailureClassName(cls.cls),
                  signature.step >= 0 ? absl::StrCat(" at step ", signature.step)
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
  spdlog::error("job failed. Root cause (first failure): rank {} (local rank {}, pid {}): {}",
                first.global_rank, first.local_rank, first.pid, root.message);
  if (const std::string advice = FailureAdvice(cls.cls); !advice.empty()) {
    spdlog::warn("{}: {}", FailureClassName(cls.cls), advice);
  }
  return options_.exit_with_worker_code ? first.code() : 1;
}

}  // namespace dlrun::launcher
