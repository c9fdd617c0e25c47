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
#include "dlrun/lr_schedule.h"
#include "dlrun/sampler.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"

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

}  // namespace
}  // namespace dlrun::worker
