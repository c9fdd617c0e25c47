#include "dlrun/lr_schedule.h"

#include <torch/optim/optimizer.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace dlrun::worker {

absl::Status Validate(const LrSchedule& s) {
  auto bad = [](const std::string& field, const std::string& v, const std::string& expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid lr schedule ", field, " '", v, "': expected ", expected));
  };
  if (s.scaling != "none" && s.scaling != "linear" && s.scaling != "sqrt") {
    return bad("scaling", s.scaling, "none, linear or sqrt");
  }
  if (!(s.start_lr > 0)) return bad("start_lr", absl::StrCat(s.start_lr), "> 0");
  if (!(s.end_lr >= 0)) return bad("end_lr", absl::StrCat(s.end_lr), ">= 0");
  if (s.tot_steps < 1) return bad("tot_steps", absl::StrCat(s.tot_steps), ">= 1");
  if (s.warmup_steps < 0) return bad("warmup_steps", absl::StrCat(s.warmup_steps), ">= 0");
  if (s.base_batch_size < 1) return bad("base_batch_size", absl::StrCat(s.base_batch_size), ">= 1");
  if (s.global_batch_size < 1) {
    return bad("global_batch_size", absl::StrCat(s.global_batch_size), ">= 1");
  }
  return absl::OkStatus();
}

double InitialLearningRate(const LrSchedule& s) {
  const double ratio = static_cast<double>(s.global_batch_size) / s.base_batch_size;
  if (s.scaling == "linear") return s.start_lr * ratio;
  if (s.scaling == "sqrt") return s.start_lr * std::sqrt(ratio);
  return s.start_lr;
}

double LearningRate(const LrSchedule& s, int64_t step) {
  const double init = InitialLearningRate(s);
  const bool scaled = s.global_batch_size > s.base_batch_size && s.scaling != "none";
  if (scaled && step < s.warmup_steps) {
    return static_cast<double>(step) / s.warmup_steps * init;
  }
  return s.end_lr +
         0.5 * (init - s.end_lr) * (1 + std::cos(M_PI * static_cast<double>(step) / s.tot_steps));
}

void SetLearningRate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

}  // namespace dlrun::worker
