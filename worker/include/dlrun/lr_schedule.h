// The SC22 tutorial's learning-rate schedule (utils/__init__.py lr_schedule): large-batch
// scaling of the base LR (none / linear / sqrt of global_batch / base_batch), a linear warm-up
// over the first warmup_steps, then cosine decay to end_lr over tot_steps.
//
//   dlrun::worker::LrSchedule lr{.start_lr = 1e-3, .tot_steps = 1000, .warmup_steps = 100};
//   dlrun::worker::validate(lr);  // throws std::invalid_argument naming the bad field
//   for (const std::string& note : dlrun::worker::ineffective_settings(lr)) std::puts(note.c_str());
//   dlrun::worker::set_learning_rate(opt, dlrun::worker::learning_rate(lr, step));
//
// Two departures from the tutorial's function, which users of it tripped over: warm-up applies
// whenever warmup_steps > 0 (the tutorial skipped it without a word unless the LR was scaled
// up), and its first step already trains, at init_lr / warmup_steps (the tutorial's was LR 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// Throws std::invalid_argument, one line naming the field, its value and what was expected.
void validate(const LrSchedule& s);
// Settings that are valid but change nothing (scaling with equal batch sizes, a warm-up as long
// as the whole run, ...), one line each, for the trainer to print at start.
std::vector<std::string> ineffective_settings(const LrSchedule& s);
// The scaled initial LR (start_lr x 1, x B/b or x sqrt(B/b)).
double initial_learning_rate(const LrSchedule& s);
// The LR at step `step` (0-based): init_lr x (step + 1) / warmup_steps during warm-up, then
// end_lr + (init_lr - end_lr) x (1 + cos(pi x step / tot_steps)) / 2.
double learning_rate(const LrSchedule& s, int64_t step);
// Sets `lr` on every parameter group of any torch::optim optimizer.
void set_learning_rate(torch::optim::Optimizer& opt, double lr);

}  // namespace dlrun::worker
