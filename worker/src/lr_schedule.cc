#include "dlrun/lr_schedule.h"

#include <torch/optim/optimizer.h>

#include <cmath>
#include <stdexcept>

#include "text.h"

namespace dlrun::worker {

void validate(const LrSchedule& s) {
  auto bad = [](const std::string& field, const std::string& v, const std::string& expected) {
    throw std::invalid_argument(
        lite::StrCat("invalid lr schedule ", field, " '", v, "': expected ", expected));
  };
  if (s.scaling != "none" && s.scaling != "linear" && s.scaling != "sqrt") {
    bad("scaling", s.scaling, "none, linear or sqrt");
  }
  if (!(s.start_lr > 0)) bad("start_lr", lite::StrCat(s.start_lr), "> 0");
  if (!(s.end_lr >= 0)) bad("end_lr", lite::StrCat(s.end_lr), ">= 0");
  if (s.tot_steps < 1) bad("tot_steps", lite::StrCat(s.tot_steps), ">= 1");
  if (s.warmup_steps < 0) bad("warmup_steps", lite::StrCat(s.warmup_steps), ">= 0");
  if (s.base_batch_size < 1) bad("base_batch_size", lite::StrCat(s.base_batch_size), ">= 1");
  if (s.global_batch_size < 1) {
    bad("global_batch_size", lite::StrCat(s.global_batch_size), ">= 1");
  }
}

std::vector<std::string> ineffective_settings(const LrSchedule& s) {
  std::vector<std::string> notes;
  if (s.scaling != "none" && s.global_batch_size == s.base_batch_size) {
    notes.push_back(lite::StrCat("lr schedule: scaling '", s.scaling,
                                 "' has no effect: the global batch size equals the base batch size (",
                                 s.base_batch_size, ")"));
  }
  if (s.scaling != "none" && s.global_batch_size > s.base_batch_size && s.warmup_steps == 0) {
    notes.push_back(lite::StrCat("lr schedule: the LR is scaled up ", initial_learning_rate(s) / s.start_lr,
                                 "x without a warm-up (warmup_steps 0)"));
  }
  if (s.warmup_steps >= s.tot_steps) {
    notes.push_back(lite::StrCat("lr schedule: warmup_steps ", s.warmup_steps,
                                 " >= tot_steps ", s.tot_steps,
                                 ": the whole run is warm-up, the cosine decay never starts"));
  }
  if (s.end_lr >= initial_learning_rate(s)) {
    notes.push_back(lite::StrCat("lr schedule: end_lr ", s.end_lr, " >= the initial LR ",
                                 initial_learning_rate(s), ": the LR does not decay"));
  }
  return notes;
}

double initial_learning_rate(const LrSchedule& s) {
  const double ratio = static_cast<double>(s.global_batch_size) / s.base_batch_size;
  if (s.scaling == "linear") return s.start_lr * ratio;
  if (s.scaling == "sqrt") return s.start_lr * std::sqrt(ratio);
  return s.start_lr;
}

double learning_rate(const LrSchedule& s, int64_t step) {
  const double init = initial_learning_rate(s);
  if (step < s.warmup_steps) return static_cast<double>(step + 1) / s.warmup_steps * init;
  return s.end_lr +
         0.5 * (init - s.end_lr) * (1 + std::cos(M_PI * static_cast<double>(step) / s.tot_steps));
}

void set_learning_rate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

}  // namespace dlrun::worker
