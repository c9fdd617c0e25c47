// Checkpoints: round trip, a flipped byte detected, a kill during the write.
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
