// Checkpoints: round trip, a flipped byte detected, a kill during the write, the collective
// resume.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "dlrun/checkpoint.h"
#include "checkpoint_testing.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/sampler.h"
#include "dlrun/worker.h"
#include "gtest/gtest.h"
#include "worker/ranks_in_threads.h"
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
    m.save(a, opt, {.step = step, .epoch = step / 10, .sampler_epoch = 7});
  }
  EXPECT_EQ(m.list().size(), 2u);  // keep_last = 2
  EXPECT_TRUE(m.holds(30) && m.holds(20));
  EXPECT_FALSE(m.holds(10));  // removed: the newest 2 are kept
  const torch::Tensor expected_next = torch::rand({3});  // RNG draws after the last save...
  Tiny b;
  torch::optim::Adam opt_b(b.parameters(), 0.1);
  auto st = m.resume_latest(b, opt_b, [](const std::string& w) { ADD_FAILURE() << w; });
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 30);
  EXPECT_EQ(st->epoch, 3);
  EXPECT_EQ(st->sampler_epoch, 7);
  EXPECT_TRUE(torch::equal(a.l->weight, b.l->weight));
  EXPECT_TRUE(torch::equal(torch::rand({3}), expected_next));  // ...are drawn again on resume
}

TEST(Checkpoint, FlippedByteIsDetectedAndTheOlderOneLoaded) {
  const std::string dir = testing::MakeTempDir();
  CheckpointManager m({.dir = dir, .keep_last = 3});
  Tiny a;
  torch::optim::SGD opt(a.parameters(), 0.1);
  m.save(a, opt, {.step = 1});
  m.save(a, opt, {.step = 2});
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
  auto st = m.resume_latest(a, opt, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("checksum mismatch"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(newest), std::string::npos);
  // A truncated file is caught too.
  std::filesystem::resize_file(m.list()[1], 30);
  warnings.clear();
  st = m.resume_latest(a, opt, [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_FALSE(st.has_value());
  EXPECT_EQ(warnings.size(), 2u);
}

TEST(Checkpoint, KillDuringWriteLeavesThePreviousOneLoadable) {
  const std::string dir = testing::MakeTempDir();
  {
    Tiny a;
    torch::optim::SGD opt(a.parameters(), 0.1);
    CheckpointManager({.dir = dir}).save(a, opt, {.step = 5});
  }
  pid_t pid = fork();
  if (pid == 0) {
    // A writer SIGKILLed after the first chunk of its temporary file is on disk.
    testing_only::SetCheckpointWriteHook([](size_t) { raise(SIGKILL); });
    CheckpointManager killed({.dir = dir, .keep_last = 3});
    Tiny a;
    torch::optim::SGD opt(a.parameters(), 0.1);
    killed.save(a, opt, {.step = 6});
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  CheckpointManager m({.dir = dir});
  EXPECT_EQ(m.list().size(), 1u);  // only the complete checkpoint has a final name
  Tiny b;
  torch::optim::SGD opt(b.parameters(), 0.1);
  auto st = m.resume_latest(b, opt);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 5);
  // The next save clears the dead writer's temporary file.
  m.save(b, opt, {.step = 7});
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
  }
}

// Extra state: named tensors and values, and the position in the epoch, come back as saved; the
// model is loaded in place (same tensors, same gradient accumulators), as load_state_dict does.
TEST(Checkpoint, ExtraTensorsValuesAndThePositionInTheEpochComeBackAndTheModelIsLoadedInPlace) {
  const std::string dir = testing::MakeTempDir();
  CheckpointManager m({.dir = dir});
  Tiny a;
  torch::optim::SGD opt(a.parameters(), 0.1);
  TrainingState st{.step = 12, .epoch = 2, .epoch_position = 40};
  st.tensors["ema.l.weight"] = a.l->weight.detach().clone() * 0.5;
  st.tensors["rng.data"] = torch::randint(0, 255, {16}, torch::kUInt8);
  st.values["best_loss"] = 0.25;
  st.values["phase"] = std::string("warmup");
  st.values["seen"] = int64_t{123456789012};
  m.save(a, opt, st);

  Tiny b;
  torch::optim::SGD opt_b(b.parameters(), 0.1);
  const torch::Tensor weight_before = b.l->weight;
  const auto accumulator = torch::autograd::impl::grad_accumulator(b.l->weight);
  auto got = m.resume_latest(b, opt_b);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->epoch_position, 40);
  ASSERT_EQ(got->tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(got->tensors.at("ema.l.weight"), st.tensors["ema.l.weight"]));
  EXPECT_TRUE(torch::equal(got->tensors.at("rng.data"), st.tensors["rng.data"]));
  ASSERT_EQ(got->values.size(), 3u);
  EXPECT_EQ(got->values.at("best_loss").toDouble(), 0.25);
  EXPECT_EQ(got->values.at("phase").toStringRef(), "warmup");
  EXPECT_EQ(got->values.at("seen").toInt(), 123456789012);
  EXPECT_TRUE(torch::equal(b.l->weight, a.l->weight));
  EXPECT_TRUE(b.l->weight.is_same(weight_before));
  EXPECT_EQ(torch::autograd::impl::try_get_grad_accumulator(b.l->weight), accumulator);
}

// A checkpoint of another model is skipped with a warning naming the parameter and both shapes,
// and leaves the model untouched; a save into a directory that cannot be made throws one line.
TEST(Checkpoint, AnotherModelsCheckpointIsSkippedUntouchedAndASaveErrorThrowsOneLine) {
  const std::string dir = testing::MakeTempDir();
  CheckpointManager m({.dir = dir});
  struct Other : torch::nn::Module {
    torch::nn::Linear l{nullptr};
    Other() { l = register_module("l", torch::nn::Linear(4, 5)); }
  } other;
  torch::optim::SGD opt_o(other.parameters(), 0.1);
  m.save(other, opt_o, {.step = 1});
  Tiny b;
  torch::optim::SGD opt_b(b.parameters(), 0.1);
  const torch::Tensor before = b.l->weight.clone();
  std::vector<std::string> warnings;
  EXPECT_FALSE(m.resume_latest(b, opt_b, [&](const std::string& w) { warnings.push_back(w); }));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("l.weight has shape [5, 4] in the checkpoint, [3, 4] in the model"),
            std::string::npos)
      << warnings[0];
  EXPECT_TRUE(torch::equal(b.l->weight, before));

  CheckpointManager bad({.dir = "/proc/no-such-dir/ckpt"});
  try {
    bad.save(b, opt_b, {.step = 2});
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/proc/no-such-dir/ckpt"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// The collective resume (issue 40): node-local directories, rank 1's empty, then rank 1's the
// newer: both ranks resume at the newest step any rank holds, from one broadcast, with equal
// digests, and the rank that had no such file says so; with none anywhere, strict throws on
// every rank. Two ranks as two threads, Gloo over one HashStore.
TEST(Checkpoint, TheCollectiveResumeTakesTheNewestStepAnyRankHoldsAndEveryRankLoadsIt) {
  const std::string root = testing::MakeTempDir();
  std::vector<std::string> failures(2);
  std::vector<torch::Tensor> saved(2);
  {  // rank 0 wrote steps 10 and 20 into its own directory; rank 1 wrote step 30 into its own
    torch::manual_seed(5);
    Tiny a;
    torch::optim::Adam opt(a.parameters(), 0.1);
    CheckpointManager(CheckpointOptions{.dir = root + "/r0"}).save(a, opt, {.step = 10});
    CheckpointManager(CheckpointOptions{.dir = root + "/r0"}).save(a, opt, {.step = 20});
    saved[0] = a.l->weight.clone();
    torch::manual_seed(6);
    Tiny b;
    torch::optim::Adam opt_b(b.parameters(), 0.1);
    CheckpointManager(CheckpointOptions{.dir = root + "/r1-later"}).save(b, opt_b, {.step = 30});
    saved[1] = b.l->weight.clone();
  }
  testing::RunRanksInThreads(2, [&](Context& ctx) {
    const int rank = ctx.rank();
    std::string& f = failures[rank];
    std::vector<std::string> warnings;
    auto warn = [&](const std::string& w) { warnings.push_back(w); };
    Tiny m;  // each rank's own initial values
    torch::optim::Adam opt(m.parameters(), 0.1);
    // 1. Rank 1's directory is empty: both resume at rank 0's step 20.
    auto st = CheckpointManager(CheckpointOptions{.dir = root + (rank == 0 ? "/r0" : "/r1-empty")})
                  .resume_latest(m, opt, ctx, {}, warn);
    if (!st || st->step != 20) f += "not step 20; ";
    if (!torch::equal(m.l->weight, saved[0])) f += "not rank 0's step 20; ";
    if (rank == 1 && (warnings.size() != 1 ||
                      warnings[0] != "resumed from step 20 sent by rank 0 (no checkpoint here)")) {
      f += "rank 1's warning: " + (warnings.empty() ? std::string("none") : warnings[0]) + "; ";
    }
    if (rank == 0 && !warnings.empty()) f += "rank 0 warned: " + warnings[0] + "; ";
    // 2. Rank 1 holds a newer one: both resume at its step 30.
    warnings.clear();
    st = CheckpointManager(CheckpointOptions{.dir = root + (rank == 0 ? "/r0" : "/r1-later")})
             .resume_latest(m, opt, ctx, {}, warn);
    if (!st || st->step != 30 || !torch::equal(m.l->weight, saved[1])) f += "not step 30; ";
    if (rank == 0 && (warnings.size() != 1 ||
                      warnings[0] != "resumed from step 30 sent by rank 1 (the newest here was step 20)")) {
      f += "rank 0's warning; ";
    }
    // 3. Nothing anywhere: nullopt on both, and strict throws on both.
    CheckpointManager none(CheckpointOptions{.dir = root + "/none-" + std::to_string(rank)});
    if (none.resume_latest(m, opt, ctx, {}, warn).has_value()) f += "resumed from nothing; ";
    try {
      none.resume_latest(m, opt, ctx, {.strict = true}, warn);
      f += "strict did not throw; ";
    } catch (const std::runtime_error& e) {
      const std::string expected = "checkpoint: no rank has a usable checkpoint in " + root +
                                   "/none-" + std::to_string(rank) + " (strict resume)";
      if (e.what() != expected) f += std::string("strict's message: ") + e.what() + "; ";
    }
  });
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

// A checkpoint written at world size 2 resumed at 1: the position in the epoch (this rank's
// samples) goes through the global count, 60 per rank at 2 is 120 at 1, and one line says so;
// one written at 3 with 1 sample per rank (3 in all) cannot split over 2 ranks: a one-line
// refusal on both.
TEST(Checkpoint, AResumeAtAnotherWorldSizeConvertsThePositionOrRefuses) {
  const std::string dir = testing::MakeTempDir();
  Tiny a;
  torch::optim::Adam opt(a.parameters(), 0.1);
  CheckpointManager(CheckpointOptions{.dir = dir + "/w2"})
      .save(a, opt, {.step = 30, .epoch_position = 60, .world_size = 2});
  CheckpointManager(CheckpointOptions{.dir = dir + "/w3"})
      .save(a, opt, {.step = 9, .epoch_position = 1, .world_size = 3});
  testing::RunRanksInThreads(1, [&](Context& one) {
    std::vector<std::string> warnings;
    auto st = CheckpointManager(CheckpointOptions{.dir = dir + "/w2"})
                  .resume_latest(a, opt, one, {},
                                [&](const std::string& w) { warnings.push_back(w); });
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->epoch_position, 120);
    EXPECT_EQ(st->world_size, 1);
    EXPECT_EQ(warnings, std::vector<std::string>{
                            "checkpoint of step 30 was written at world size 2, this run has 1: "
                            "the position in the epoch, 60 samples per rank there, is 120 per "
                            "rank here (120 in all)"});
  });
  std::vector<std::string> said(2);
  testing::RunRanksInThreads(2, [&](Context& ctx) {
    const int rank = ctx.rank();
    Tiny m;
    torch::optim::Adam o(m.parameters(), 0.1);
    try {
      CheckpointManager(CheckpointOptions{.dir = dir + "/w3"}).resume_latest(m, o, ctx);
      said[rank] = "resumed";
    } catch (const std::runtime_error& e) {
      said[rank] = e.what();
    }
  });
  const std::string refusal =
      "checkpoint of step 9 was written at world size 3 with 1 samples per rank into the epoch "
      "(3 in all), which does not split over 2 ranks: resume at a world size that divides it, "
      "or from a checkpoint at an epoch's start";
  EXPECT_EQ(said[0], refusal);
  EXPECT_EQ(said[1], refusal);
}

// The one-rank resume in a job of several ranks: each rank would resume alone (node-local
// directories: at different steps, then out of step until the hang detection ends the job).
// One line naming the collective form instead.
TEST(Checkpoint, TheOneRankResumeInAJobOfSeveralRanksIsAnErrorNamingTheCollectiveOne) {
  const std::string dir = testing::MakeTempDir();
  CheckpointManager m({.dir = dir});
  Tiny a;
  torch::optim::SGD opt(a.parameters(), 0.1);
  m.save(a, opt, {.step = 3});
  EXPECT_TRUE(m.resume_latest(a, opt).has_value());  // one process: as before
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  try {
    (void)m.resume_latest(a, opt);
    ADD_FAILURE() << "the one-rank resume ran in a job of 2 ranks";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("resume_latest(model, optimizer) in a job of 2 ranks: "
                                         "each rank would resume from its own directory alone"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("call resume_latest(model, optimizer, ctx) on every rank"),
              std::string::npos) << e.what();
  }
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
}

}  // namespace
}  // namespace dlrun::worker
