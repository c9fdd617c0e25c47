// Checkpoints for elastic restarts: model + optimizer + step + epoch + RNG + sampler epoch,
// written atomically (temp file, fsync, rename, fsync of the directory) with a checksum, the
// newest `keep_last` kept. resumeLatest() loads the newest checkpoint that verifies and skips a
// damaged one with a warning: a damaged file is never loaded.
//
// File layout: "DLRUNCK1" | payload length (u64 LE) | FNV-1a 64 of the payload (u64 LE) |
// payload (a torch::serialize archive).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::worker {

struct TrainingState {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t sampler_epoch = 0;
};

struct CheckpointOptions {
  std::string dir;
  int keep_last = 3;
  // Fault injection for tests: called after each chunk of the temporary file is written.
  std::function<void(size_t bytes_written)> on_write_progress;
};

class CheckpointManager {
 public:
  explicit CheckpointManager(CheckpointOptions options);
  // Writes checkpoint `state.step` (call it on one rank, e.g. rank 0). Also saves the CPU RNG.
  absl::Status save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                    const TrainingState& state);
  // Loads the newest valid checkpoint into model and optimizer (and restores the CPU RNG).
  // nullopt when there is none; damaged files are reported through `warn` and skipped.
  absl::StatusOr<std::optional<TrainingState>> resumeLatest(
      torch::nn::Module& model, torch::optim::Optimizer& optimizer,
      const std::function<void(const std::string&)>& warn = {});
  // Checkpoint files, newest first.
  std::vector<std::string> list() const;

 private:
  CheckpointOptions o_;
};

}  // namespace dlrun::worker
