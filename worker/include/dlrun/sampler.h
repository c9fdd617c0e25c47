// DistributedSampler: which dataset indices this rank visits in an epoch, as PyTorch's
// torch.utils.data.DistributedSampler, index for index for the same seed and epoch (the shuffle
// is torch.randperm from a generator seeded with seed + epoch, shared by all ranks), padded
// (repeating the first indices) or truncated (drop_last) to a multiple of the world size, then
// every world_size-th index starting at the rank.
#pragma once

#include <cstdint>
#include <vector>

namespace dlrun::worker {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions o);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // The indices of this rank for the current epoch (same length on every rank).
  std::vector<int64_t> indices() const;
  int64_t num_samples() const;  // per rank

 private:
  SamplerOptions o_;
  int64_t epoch_ = 0;
};

}  // namespace dlrun::worker
