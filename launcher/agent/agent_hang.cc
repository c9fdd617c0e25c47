// The agent's hang path (agent.h, hang_watch.h): each pass of the supervision loop asks the hang
// watch whether a worker or the whole group hangs; a hang is named from every rank's stack
// before the group is stopped, and that one name goes into the log line, the capture's
// suspects, the restart and --report-json alike.
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/agent/agent.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

std::vector<int> Agent::StoppedRanks() const {
  std::vector<int> stopped;
  for (const Worker& w : workers_) {
    if (w.alive && processes_.Stopped(w.pid)) stopped.push_back(w.rank);
  }
  return stopped;
}

HangVerdict Agent::WhereRanksAre() {
  if (!options_.dump_stacks) return {};
  const std::vector<int> stopped = StoppedRanks();
  return NameHung(GroupStacks(options_.dump_stacks(LiveTargets(), options_.capture_bound)),
                  stopped);
}

std::optional<Agent::Watch> Agent::CheckHangs(SteadyTime* next) {
  const HangOptions& o = options_.hang;
  const SteadyTime now = clock_.Now();
  if (now >= next_cpu_) {
    hang_.Cpu(telemetry_.CpuCores(), now, telemetry_.GpuUtilizationMax());
    next_cpu_ = now + defaults::kTelemetryWindow;
  }
  const double timeout_s = std::chrono::duration<double>(o.timeout).count();
  const bool sampled = options_.telemetry.on && options_.telemetry.sample_processes;
  if (hang_.TimeoutNeverArmed(now)) {
    const std::string what =
        sampled ? absl::StrFormat("so the timeout applies only to the whole group idle (every "
                                  "rank under %g of a core) that long; for a per-rank timeout,",
                                  o.idle_cores)
                : std::string("and with --telemetry off nothing samples their CPU use, so it "
                              "cannot take effect;");
    spdlog::warn("--hang-timeout {:g} s: no rank has sent a heartbeat or step record in its "
                 "first {:g} s, {} call dlrun_report.heartbeat() (Python) or "
                 "dlrun::worker::heartbeat() (C++) each step",
                 timeout_s, timeout_s, what);
  }
  std::optional<HangWatch::Hung> hung = hang_.Check(now, next);
  *next = std::min(*next, next_cpu_);
  if (hung) {
    for (const Worker& w : workers_) {
      if (w.pid == hung->pid) return Watch{Watch::Outcome::kHung, hung->why, 0, w.rank};
    }
  }
  if (!hang_.IdleWorthALine(now)) return std::nullopt;
  hang_.MarkIdleReported();
  const std::string idle = absl::StrFormat(
      "every rank has used under %g of a core for %.0f s", o.idle_cores,
      std::chrono::duration<double>(hang_.IdleFor(now).value_or(Millis(0))).count());
  if (hang_.IdleIsHang(now)) return Watch{Watch::Outcome::kHung, idle, 0, -1};
  const HangVerdict v = WhereRanksAre();
  spdlog::warn("{}{}{}; it may be hung (--hang-timeout S stops and restarts a group idle that "
               "long)",
               idle, v.where.empty() ? "" : ": ", v.where);
  return std::nullopt;
}

int Agent::AfterHang(const std::string& reason, int rank) {
  const std::vector<int> stopped = StoppedRanks();
  std::optional<Forensics::Capture> capture =
      forensics_.CaptureBeforeKill(LiveTargets(), /*telling=*/true, "a hang");
  HangVerdict v;
  if (capture) {
    v = NameHung(GroupStacks(capture->ranks), stopped);
  } else {
    v.culprits = stopped;
  }
  std::vector<int> culprits = v.culprits;
  // Every rank here waits in a collective: the one holding them up is not on this node.
  if (culprits.empty() && rank >= 0 && !v.all_wait) culprits = {rank};
  const std::string who =
      culprits.empty()
          ? absl::StrCat("the group (ranks ", RankRanges(Ranks()), ")")
          : RanksPhrase(culprits);
  const std::string detected =
      rank < 0 || (culprits.size() == 1 && culprits[0] == rank)
          ? reason
          : absl::StrCat("rank ", rank, ": ", reason);
  // With every rank of the group here, none is on another node: they wait on each other.
  const bool whole_group_here = current_.world_size == static_cast<int>(workers_.size());
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
  spdlog::error("{}: stopping the worker group", message);
  StopGroup(SIGTERM);
  const int culprit = culprits.empty() ? (workers_.empty() ? 0 : workers_[0].rank) : culprits[0];
  std::shared_future<std::string> stacks_json;
  if (capture) {
    stacks_json = Forensics::JsonWhenRead(
        forensics_.FinishCapture(*std::move(capture), attempt_, -1, "", culprits));
  }
  telemetry_.MaybePublish(/*now_anyway=*/true);
  telemetry_.NoteFailure({culprit, options_.hostname, FailureClassName(FailureClass::kHang),
                          message, stacks_json, forensics_.ReadFlightRecorder(attempt_, Ranks()),
                          {}});
  const FailureSignature signature{FailureClass::kHang, culprit, telemetry_.LastStep(culprit),
                                   who};
  if (RepeatsLastFailure(signature)) {
    spdlog::error("{} hung the same way twice ({}): not restarting, a restart would repeat it",
                  who,
                  signature.step >= 0
                      ? absl::StrCat("after step ", signature.step, ", its last reported")
                      : std::string("before its first step"));
    source_->OnFailure(absl::StrCat(message, ", the same way as the attempt before"), true);
  } else if (source_->OnFailure(message, false)) {
    spdlog::warn("restarting the worker group after a hang: {} of {}",
                 current_.restart_count + 1, current_.max_restarts);
    return -1;
  }
  spdlog::error("job failed. Root cause (first failure): {}", message);
  spdlog::warn("hang: {}", FailureAdvice(FailureClass::kHang));
  return kHangExitCode;
}

}  // namespace dlrun::launcher
