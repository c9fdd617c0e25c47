// The distributed sampler: partitions, padding, per-epoch shuffles.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "dlrun/checkpoint.h"
#include "dlrun/data_sampler.h"
#include "dlrun/worker.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/sampler.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "worker/ranks_in_threads.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::worker {
namespace {

TEST(Sampler, PartitionsPadsAndShufflesPerEpoch) {
  std::multiset<int64_t> seen;
  std::vector<std::vector<int64_t>> per_rank;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s({.dataset_size = 10, .rank = r, .world_size = 3, .shuffle = true, .seed = 5});
    auto idx = s.indices();
    EXPECT_EQ(idx.size(), 4u);  // ceil(10 / 3), padded
    seen.insert(idx.begin(), idx.end());
    per_rank.push_back(idx);
    s.set_epoch(1);
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

// PyTorch's own torch.utils.data.DistributedSampler (torch 2.15, Python) gives every rank the
// same indices as dlrun's for the same dataset size, seed and epoch: 3 seeds x 2 epochs x 2
// world sizes, every rank, with and without drop_last (issue 40: a Python twin of a C++ trainer
// sees the same samples).
TEST(Sampler, EqualsPyTorchsDistributedSamplerIndexForIndex) {
  if (testing::RunCommand({TEST_PYTHON, "-c", "import torch.utils.data"}, {},
                          std::chrono::seconds(60)).exit_code != 0) {
    GTEST_SKIP() << "torch is needed: " << TEST_PYTHON << " (scripts/install-deps)";
  }
  const std::string script =
      "from torch.utils.data import DistributedSampler\n"
      "for seed in (0, 5, 1234):\n"
      "  for epoch in (0, 1):\n"
      "    for world in (2, 3):\n"
      "      for drop in (False, True):\n"
      "        for rank in range(world):\n"
      "          s = DistributedSampler(list(range(11)), num_replicas=world, rank=rank,\n"
      "                                 shuffle=True, seed=seed, drop_last=drop)\n"
      "          s.set_epoch(epoch)\n"
      "          print(seed, epoch, world, int(drop), rank, ','.join(map(str, s)))\n";
  testing::ProcResult py = testing::RunCommand({TEST_PYTHON, "-c", script}, {},
                                               std::chrono::seconds(120));
  ASSERT_EQ(py.exit_code, 0) << py.output;
  std::string mine;
  for (uint64_t seed : {0, 5, 1234}) {
    for (int64_t epoch : {0, 1}) {
      for (int world : {2, 3}) {
        for (bool drop : {false, true}) {
          for (int rank = 0; rank < world; ++rank) {
            DistributedSampler d({.dataset_size = 11, .rank = rank, .world_size = world,
                                  .shuffle = true, .seed = seed, .drop_last = drop});
            d.set_epoch(epoch);
            std::string line = std::to_string(seed) + " " + std::to_string(epoch) + " " +
                               std::to_string(world) + " " + std::to_string(drop) + " " +
                               std::to_string(rank) + " ";
            const std::vector<int64_t> idx = d.indices();
            for (size_t i = 0; i < idx.size(); ++i) {
              line += (i ? "," : "") + std::to_string(idx[i]);
            }
            mine += line + "\n";
          }
        }
      }
    }
  }
  EXPECT_EQ(py.output, mine);
}

// The torch::data sampler hands out exactly DistributedSampler's indices through LibTorch's own
// data loader, and set_start() makes the next pass begin mid-epoch where position() left off.
TEST(DataLoaderSampler, TheLoaderSeesTheSamplersIndicesAndAResumeStartsMidEpoch) {
  struct Ids : torch::data::datasets::Dataset<Ids, int64_t> {
    int64_t get(size_t i) override { return static_cast<int64_t>(i); }
    torch::optional<size_t> size() const override { return 10; }
  };
  const SamplerOptions o{.dataset_size = 10, .rank = 1, .world_size = 2, .seed = 5};
  DataLoaderSampler sampler(o);
  auto loader = torch::data::make_data_loader(Ids(), sampler, torch::data::DataLoaderOptions(2));
  DistributedSampler reference(o);
  for (int64_t epoch : {0, 1}) {
    sampler.set_epoch(epoch);
    reference.set_epoch(epoch);
    std::vector<int64_t> got;
    for (const std::vector<int64_t>& batch : *loader) got.insert(got.end(), batch.begin(), batch.end());
    EXPECT_EQ(got, reference.indices()) << "epoch " << epoch;
    EXPECT_EQ(sampler.position(), 5);
  }
  // Two batches of epoch 1 done, then a restart: the new pass gives the rest of epoch 1.
  sampler.set_epoch(1);
  sampler.set_start(4);
  std::vector<int64_t> rest;
  for (const std::vector<int64_t>& batch : *loader) rest.insert(rest.end(), batch.begin(), batch.end());
  const std::vector<int64_t> epoch1 = reference.indices();
  EXPECT_EQ(rest, std::vector<int64_t>(epoch1.begin() + 4, epoch1.end()));
}

// The context's small collectives between two ranks (two threads, Gloo over one HashStore).
TEST(ContextCollectives, AllReduceGatherBroadcastBarrierAndRanksAgree) {
  std::vector<std::string> failures(2);
  testing::RunRanksInThreads(2, [&](Context& ctx) {
    const int rank = ctx.rank();
    std::string& f = failures[rank];
    if (ctx.all_reduce(torch::tensor({rank + 1.0})).item<double>() != 3.0) f += "all_reduce; ";
    if (ctx.all_reduce(torch::tensor({rank + 1.0}), c10d::ReduceOp::MAX).item<double>() != 2.0) {
      f += "all_reduce MAX; ";
    }
    auto all = ctx.all_gather(torch::tensor({10 * rank, 10 * rank + 1}));
    if (all.size() != 2 || !torch::equal(all[1], torch::tensor({10, 11}))) f += "all_gather; ";
    if (ctx.broadcast(torch::tensor({rank == 1 ? 7 : 0}), 1).item<int64_t>() != 7) f += "broadcast; ";
    ctx.barrier();
    if (!ctx.ranks_agree(0x1234567890abcdefULL)) f += "ranks_agree(same); ";
    if (ctx.ranks_agree(rank == 0 ? 1 : 2)) f += "ranks_agree(different); ";
    if (ctx.ranks_differing(rank == 0 ? 1 : 2) != std::vector<int>{1}) f += "ranks_differing; ";
    try {
      ctx.broadcast(torch::tensor({0}), 2);
      f += "broadcast from rank 2 accepted; ";
    } catch (const std::invalid_argument& e) {
      if (std::string(e.what()) != "broadcast: root 2 is not a rank of this 2-rank group") f += e.what();
    }
  });
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

}  // namespace
}  // namespace dlrun::worker
