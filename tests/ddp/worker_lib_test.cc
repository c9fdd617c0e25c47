// LR schedule against the closed-form formulas, the sampler, and checkpoints under faults.
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

TEST(Sampler, PartitionsPadsAndShufflesPerEpoch) {
  std::multiset<int64_t> seen;
  std::vector<std::vector<int64_t>> per_rank;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s({.dataset_size = 10, .rank = r, .world_size = 3, .shuffle = true, .seed = 5});
    auto idx = s.indices();
    EXPECT_EQ(idx.size(), 4u);  // ceil(10 / 3), padded
    seen.insert(idx.begin(), idx.end());
    per_rank.push_back(idx);
    s.setEpoch(1);
    EXPECT_NE(s.indices(), idx);  // a new permutation each epoch
  }
  EXPECT_EQ(seen.size(), 12u);
  for (int64_t i = 0; i < 10; ++i) EXPECT_GE(seen.count(i), 1u) << i;  // every index visited
  DistributedSampler d({.dataset_size = 10, .rank = 2, .world_size = 3, .shuffle = false,
                        .seed = 0, .drop_last = true});
  EXPECT_EQ(d.indices(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_THROW(DistributedSampler({.dataset_size = 10, .rank = 3, .world_size = 3}),
               std::invalid_argument);
}

struct Tiny : torch::nn::Module {
  torch::nn::Linear l{nullptr};
  Tiny() { l = register_module("l", torch::nn::Linear(4, 3)); }
};

TEST(Checkpoint, RoundTripKeepsLastKAndRestoresRng) {
  const std::string dir = testing::MakeTempDir();
  CheckpointManager m({.dir = dir, .keep_last = 2});
  Tiny a;
  torch::optim::Adam opt(a.parameters(), 0.1);
  for (int64_t step : {10, 20, 30}) {
    ASSERT_TRUE(m.save(a, opt, {.step = step, .epoch = step / 10, .sampler_epoch = 7}).ok());
  }
  EXPECT_EQ(m.list().size(), 2u);  // keep_last = 2
  const torch::Tensor expected_next = torch::rand({3});  // RNG draws after the last save...
  Tiny b;
  torch::optim::Adam opt_b(b.parameters(), 0.1);
  auto st = m.resumeLatest(b, opt_b, [](const std::string& w) { ADD_FAILURE() << w; });
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->has_value());
  EXPECT_EQ((*st)->step, 30);
  EXPECT_EQ((*st)->epoch, 3);
  EXPECT_EQ((*st)->sampler_epoch, 7);
  EXPECT_TRUE(torch::equal(a.l->weight, b.l->weight));
  EXPECT_TRUE(torch::equal(torch::rand({3}), expected_next));  // ...are drawn again on resume
}

TEST(Checkpoint, FlippedByteIsDetectedAndTheOlderOneLoaded) {
  const std::string dir = testing::MakeTempDir();
  CheckpointManager m({.dir = dir, .keep_last = 3});
  Tiny a;
  torch::optim::SGD opt(a.parameters(), 0.1);
  ASSERT_TRUE(m.save(a, opt, {.step = 1}).ok());
  ASSERT_TRUE(m.save(a, opt, {.step = 2}).ok());
  const std::string newest = m.list()[0];
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.seekg(100);
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x01));  // one flipped bit in the payload
  }
  std::vector<std::string> warnings;
  auto st = m.resumeLatest(a, opt, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->has_value());
  EXPECT_EQ((*st)->step, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("checksum mismatch"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(newest), std::string::npos);
  // A truncated file is caught too.
  std::filesystem::resize_file(m.list()[1], 30);
  warnings.clear();
  st = m.resumeLatest(a, opt, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(st->has_value());
  EXPECT_EQ(warnings.size(), 2u);
}

TEST(Checkpoint, KillDuringWriteLeavesThePreviousOneLoadable) {
  const std::string dir = testing::MakeTempDir();
  {
    Tiny a;
    torch::optim::SGD opt(a.parameters(), 0.1);
    ASSERT_TRUE(CheckpointManager({.dir = dir}).save(a, opt, {.step = 5}).ok());
  }
  pid_t pid = fork();
  if (pid == 0) {
    // A writer SIGKILLed after the first chunk of its temporary file is on disk.
    CheckpointManager killed({.dir = dir, .keep_last = 3,
                              .on_write_progress = [](size_t) { raise(SIGKILL); }});
    Tiny a;
    torch::optim::SGD opt(a.parameters(), 0.1);
    (void)killed.save(a, opt, {.step = 6});
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  CheckpointManager m({.dir = dir});
  EXPECT_EQ(m.list().size(), 1u);  // only the complete checkpoint has a final name
  Tiny b;
  torch::optim::SGD opt(b.parameters(), 0.1);
  auto st = m.resumeLatest(b, opt);
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->has_value());
  EXPECT_EQ((*st)->step, 5);
  // The next save clears the dead writer's temporary file.
  ASSERT_TRUE(m.save(b, opt, {.step = 7}).ok());
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace dlrun::worker
