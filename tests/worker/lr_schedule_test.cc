// The LR schedule against the closed-form formulas (large-batch scaling, warm-up, decay).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "dlrun/checkpoint.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/sampler.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"

namespace dlrun::worker {
namespace {

TEST(LrSchedule, ClosedFormAtWarmupStartEndAndDecayEnd) {
  LrSchedule s;
  s.start_lr = 1e-3;
  s.end_lr = 1e-5;
  s.tot_steps = 1000;
  s.warmup_steps = 100;
  s.base_batch_size = 64;
  s.global_batch_size = 512;
  s.scaling = "sqrt";
  validate(s);
  EXPECT_TRUE(ineffective_settings(s).empty());
  const double init = 1e-3 * std::sqrt(8.0);
  EXPECT_DOUBLE_EQ(initial_learning_rate(s), init);
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), init / 100);          // the first step trains
  EXPECT_DOUBLE_EQ(learning_rate(s, 49), 0.5 * init);          // linear
  EXPECT_DOUBLE_EQ(learning_rate(s, 99), init);                // the last warm-up step
  EXPECT_DOUBLE_EQ(learning_rate(s, 100),                      // warm-up end: cosine from here
                   1e-5 + 0.5 * (init - 1e-5) * (1 + std::cos(M_PI * 100 / 1000)));
  EXPECT_NEAR(learning_rate(s, 1000), 1e-5, 1e-15);             // decay end: end_lr
  s.scaling = "linear";
  EXPECT_DOUBLE_EQ(initial_learning_rate(s), 8e-3);
  s.scaling = "none";  // warm-up on its own, without scaling
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 1e-3 / 100);
  EXPECT_DOUBLE_EQ(learning_rate(s, 99), 1e-3);
  EXPECT_NEAR(learning_rate(s, 500), 1e-5 + 0.5 * (1e-3 - 1e-5), 1e-15);
  s.warmup_steps = 0;  // no warm-up: cosine from start_lr at step 0
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 1e-3);
  s.scaling = "cubic";
  try {
    validate(s);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "invalid lr schedule scaling 'cubic': expected none, linear or sqrt");
  }
}

TEST(LrSchedule, SettingsWithoutEffectAreNamed) {
  LrSchedule s{.start_lr = 1e-3, .tot_steps = 100, .warmup_steps = 100, .global_batch_size = 64,
               .base_batch_size = 64, .scaling = "sqrt"};
  const std::vector<std::string> notes = ineffective_settings(s);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0], "lr schedule: scaling 'sqrt' has no effect: the global batch size equals "
                      "the base batch size (64)");
  EXPECT_EQ(notes[1], "lr schedule: warmup_steps 100 >= tot_steps 100: the whole run is warm-up, "
                      "the cosine decay never starts");
  s = {.start_lr = 1e-3, .tot_steps = 100, .global_batch_size = 256, .base_batch_size = 64,
       .scaling = "linear"};
  ASSERT_EQ(ineffective_settings(s).size(), 1u);
  EXPECT_EQ(ineffective_settings(s)[0], "lr schedule: the LR is scaled up 4x without a warm-up (warmup_steps 0)");
}

TEST(LrSchedule, SetsEveryParameterGroupOfAnyOptimizer) {
  auto p = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  set_learning_rate(sgd, 0.25);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.25);
  torch::optim::Adam adam({p}, torch::optim::AdamOptions(0.1));
  set_learning_rate(adam, 0.5);
  EXPECT_DOUBLE_EQ(adam.param_groups()[0].options().get_lr(), 0.5);
}

}  // namespace
}  // namespace dlrun::worker
