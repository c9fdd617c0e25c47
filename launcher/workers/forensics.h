// What the agent learns of a failure besides the exits (docs/STACKS.md): the live workers'
// stacks before a stop (the capture before kill) and what they say once named, the faulting
// frame of a crashed rank, and the Flight Recorder's first disagreement. The agent decides when
// to look; this does the looking, off the restart's path where it can.
#pragma once

#include <future>
#include <optional>
#include <string>
#include <vector>

#include "launcher/stacks/stacks.h"
#include "launcher/workers/agent_options.h"
#include "launcher/workers/agent_telemetry.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/run_dir.h"

namespace dlrun::launcher {

class Forensics {
 public:
  // All outlive this (the agent's members).
  Forensics(const AgentOptions& options, const RunDir& run_dir, AgentTelemetry& telemetry,
            Clock& clock)
      : options_(options), run_dir_(run_dir), telemetry_(telemetry), clock_(clock) {}

  // The live workers' stacks before a stop, when the mode says so (`telling`: the failure is
  // one whose stacks say something, for kAuto): only the dump itself, so the stop is not
  // delayed by naming frames.
  struct Capture {
    std::vector<RankStack> ranks;
    double took_s = 0;
    std::string why;
  };
  std::optional<Capture> CaptureBeforeKill(const std::vector<DumpTarget>& live, bool telling,
                                           const std::string& why);
  // After the stop, off the restart's path (naming a LibTorch worker's frames reads its
  // libraries' symbol tables: seconds): names, groups, writes attempt `attempt`'s
  // stacks.{json,txt}, logs the suspects and, for a failure of `failed_rank` (>= 0), "WHAT; the
  // other N ranks were in F at file:line".
  // `suspects`: who the agent already named (a hang's culprits, maybe none), instead of the odd
  // ones out.
  std::shared_future<StackReport> FinishCapture(
      Capture c, int attempt, int failed_rank = -1, std::string what = "",
      std::optional<std::vector<int>> suspects = std::nullopt);
  // A finished capture's StackReportJson, made when first read (the report), not before.
  static std::shared_future<std::string> JsonWhenRead(std::shared_future<StackReport> kept);
  // Every FinishCapture done: their files and lines come before the report and the run
  // directory's end.
  void WaitForCaptures();

  // The faulting frame of rank `rank`'s crash trace (its innermost frame): ready, and in
  // `named`, when the trace named it; else named by options.name_frames in the background.
  std::shared_future<std::string> NameFaultingFrame(int rank, StackThread crash,
                                                    std::string* named);
  // Attempt `attempt`'s Flight Recorder dumps (this node's `ranks`), where they first
  // disagree: logged, and returned as JSON for the report ("" without dumps).
  std::string ReadFlightRecorder(int attempt, const std::vector<int>& ranks) const;

 private:
  const AgentOptions& options_;
  const RunDir& run_dir_;
  AgentTelemetry& telemetry_;
  Clock& clock_;
  std::vector<std::shared_future<StackReport>> captures_;  // FinishCapture's, to wait for
};

}  // namespace dlrun::launcher
