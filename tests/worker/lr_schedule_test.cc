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
  ASSERT_TRUE(Validate(s).ok());
  const double init = 1e-3 * std::sqrt(8.0);
  EXPECT_DOUBLE_EQ(InitialLearningRate(s), init);
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 0.0);                 // warm-up starts at 0
  EXPECT_DOUBLE_EQ(LearningRate(s, 50), 0.5 * init);          // linear
  EXPECT_DOUBLE_EQ(LearningRate(s, 100),                      // warm-up end: cosine from here
                   1e-5 + 0.5 * (init - 1e-5) * (1 + std::cos(M_PI * 100 / 1000)));
  EXPECT_NEAR(LearningRate(s, 1000), 1e-5, 1e-15);             // decay end: end_lr
  s.scaling = "linear";
  EXPECT_DOUBLE_EQ(InitialLearningRate(s), 8e-3);
  s.scaling = "none";  // no scaling: no warm-up, cosine from start_lr at step 0
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 1e-3);
  EXPECT_NEAR(LearningRate(s, 500), 1e-5 + 0.5 * (1e-3 - 1e-5), 1e-15);
  s.scaling = "cubic";
  auto v = Validate(s);
  EXPECT_EQ(std::string(v.message()), "invalid lr schedule scaling 'cubic': expected none, linear or sqrt");
}

TEST(LrSchedule, SetsEveryParameterGroupOfAnyOptimizer) {
  auto p = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  SetLearningRate(sgd, 0.25);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.25);
  torch::optim::Adam adam({p}, torch::optim::AdamOptions(0.1));
  SetLearningRate(adam, 0.5);
  EXPECT_DOUBLE_EQ(adam.param_groups()[0].options().get_lr(), 0.5);
}

}  // namespace
}  // namespace dlrun::worker
