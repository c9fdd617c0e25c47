// The SC22 tutorial's learning-rate schedule (utils/__init__.py lr_schedule): large-batch
// scaling of the base LR (none / linear / sqrt of global_batch / base_batch), a linear warm-up
// over warmup_steps when the LR was scaled up, then cosine decay to end_lr over tot_steps.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace torch::optim {
class Optimizer;
}

namespace dlrun::worker {

struct LrSchedule {
  double start_lr = 1e-3;  // the LR for base_batch_size
  double end_lr = 0;
  int64_t tot_steps = 1000;
  int64_t warmup_steps = 0;
  int64_t global_batch_size = 64;
  int64_t base_batch_size = 64;
  std::string scaling = "none";  // none | linear | sqrt
};

// Checks the fields; errors name the bad value and what was expected.
absl::Status Validate(const LrSchedule& s);
// The scaled initial LR (start_lr x 1, x B/b or x sqrt(B/b)).
double InitialLearningRate(const LrSchedule& s);
// The LR at step `step` (0-based).
double LearningRate(const LrSchedule& s, int64_t step);
// Sets `lr` on every parameter group of any torch::optim optimizer.
void SetLearningRate(torch::optim::Optimizer& opt, double lr);

}  // namespace dlrun::worker
