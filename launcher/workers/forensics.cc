#include "launcher/workers/forensics.h"

#include "absl/strings/str_cat.h"
#include "launcher/stacks/flight_recorder.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

std::optional<Forensics::Capture> Forensics::CaptureBeforeKill(const std::vector<DumpTarget>& live,
                                                               bool telling,
                                                               const std::string& why) {
  if (!options_.dump_stacks || options_.capture_before_kill == CaptureMode::kOff) return {};
  if (options_.capture_before_kill == CaptureMode::kAuto && !telling) return {};
  if (live.empty()) return {};
  const SteadyTime t0 = clock_.Now();
  Capture c{options_.dump_stacks(live, options_.capture_bound), 0, why};
  c.took_s = std::chrono::duration<double>(clock_.Now() - t0).count();
  return c;
}

std::shared_future<StackReport> Forensics::FinishCapture(Capture c, int attempt, int failed_rank,
                                                         std::string what,
                                                         std::optional<std::vector<int>> suspects) {
  auto keep = [this, c = std::move(c), attempt, name = options_.name_frames, failed_rank,
               what = std::move(what), suspects = std::move(suspects),
               when = clock_.WallSeconds()]() mutable {
    if (name) name(&c.ranks);
    const size_t n = c.ranks.size();
    StackReport r = GroupStacks(std::move(c.ranks));
    if (suspects) {
      r.suspects = *suspects;
    } else if (failed_rank >= 0) {
      // A rank failed: it is the cause, not the odd stack among the live ones (the line said
      // "suspects: rank 3" after rank 1 was killed, rank 3 being the one that saw it first).
      r.suspects.clear();
    }
    r.took_s = c.took_s;
    const std::string where = run_dir_.WriteStacks(attempt, r);
    spdlog::info("stacks of {} live worker(s) before the stop ({}), read in {:.2f} s: {}; {}", n,
                 c.why, r.took_s,
                 !r.suspects.empty() ? absl::StrCat("suspects: ", RanksPhrase(r.suspects))
                 : failed_rank >= 0  ? absl::StrCat("rank ", failed_rank, " failed, not read")
                                     : std::string("no suspects"),
                 where);
    if (failed_rank >= 0) {
      if (const std::string others = WhereTheOthersWere(r, failed_rank); !others.empty()) {
        spdlog::warn("{}; {}", what, others);
      }
    }
    // The live page and /api/job (through this node's next publication).
    telemetry_.SetStacks(
        StackSummaryJson(r, options_.hostname, c.why, when, telemetry::kMaxTelemetryStacksBytes));
    return r;
  };
  std::shared_future<StackReport> f = std::async(std::launch::async, std::move(keep)).share();
  captures_.push_back(f);
  return f;
}

std::shared_future<std::string> Forensics::JsonWhenRead(std::shared_future<StackReport> kept) {
  return std::async(std::launch::deferred, [kept] { return StackReportJson(kept.get()); }).share();
}

void Forensics::WaitForCaptures() {
  for (const auto& c : captures_) c.wait();
}

std::shared_future<std::string> Forensics::NameFaultingFrame(int rank, StackThread crash,
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
  return std::async(std::launch::async,
                    [rank, crash = std::move(crash), name = options_.name_frames]() mutable {
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

std::string Forensics::ReadFlightRecorder(int attempt, const std::vector<int>& ranks) const {
  if (!run_dir_.has_logs()) return "";
  std::vector<std::string> errors;
  const std::vector<FrRank> dumps = run_dir_.ReadFlightRecorder(attempt, &errors);
  for (const std::string& e : errors) spdlog::warn("flight recorder: cannot read {}", e);
  const std::optional<FrVerdict> v = FirstDisagreement(dumps, ranks);
  if (!v) return "";
  spdlog::warn("flight recorder: {} (dumps of {} rank(s) in {})", v->text, dumps.size(),
               run_dir_.FlightRecorderDir(attempt));
  return FrVerdictJson(*v).dump();
}

}  // namespace dlrun::launcher
