// Preflight: a node's checks before it joins a round (docs/USAGE.md "Preflight and bad nodes";
// thresholds in common/defaults.h). Local checks fail the node at once; the compute probe's
// figure travels with the node's join, and the rendezvous compares it across the round.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/base/nvml.h"

namespace dlrun::launcher {

enum class PreflightMode { kOff, kQuick, kFull };
// "off", "quick" or "full"; anything else is a one-line error naming the value.
absl::StatusOr<PreflightMode> ParsePreflightMode(const std::string& text);
const char* PreflightModeName(PreflightMode mode);

struct PreflightCheck {
  std::string name;    // "compute", "disk", "gpus", "gpu 1"
  bool ok = true;
  std::string detail;  // "14.2 GFLOP/s on one core", "3 uncorrected ECC errors since boot"
};

struct PreflightReport {
  std::vector<PreflightCheck> checks;
  double gflops = 0;  // the compute probe's figure (0: not run)
  // The failed checks as "NAME: DETAIL; ...", empty when every check passed.
  std::string Failures() const;
};

struct PreflightAsk {
  PreflightMode mode = PreflightMode::kQuick;
  int gpus_needed = 0;         // GPUs the node's workers take (0: CPU job, not checked)
  std::string checkpoint_dir;  // its free space (of its nearest existing ancestor) is checked
};

// Runs the checks; `nvml` may be null (no driver: GPU checks are skipped unless GPUs are needed).
PreflightReport RunPreflight(const PreflightAsk& ask, const Nvml* nvml);

// GFLOP/s of a float matrix product (defaults::kPreflightGemmSize square) on the calling thread,
// repeated for `budget`: the compute probe (a throttled or contended CPU shows here).
double GemmProbe(std::chrono::milliseconds budget);

// The directory a program names after --checkpoint-dir, --checkpoint_dir, --save-dir,
// --save_dir, --output-dir or --output_dir ("--flag DIR" or "--flag=DIR"), else `fallback`.
std::string CheckpointDirOf(const std::vector<std::string>& program_args,
                            const std::string& fallback);

}  // namespace dlrun::launcher
