#include "dlrun/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dlrun::worker {

DistributedSampler::DistributedSampler(SamplerOptions o) : o_(o) {
  if (o_.world_size < 1 || o_.rank < 0 || o_.rank >= o_.world_size || o_.dataset_size < 0) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(o_.rank) +
                                " of world size " + std::to_string(o_.world_size) +
                                " with dataset size " + std::to_string(o_.dataset_size) +
                                " (expected 0 <= rank < world size, size >= 0)");
  }
}

int64_t DistributedSampler::num_samples() const {
  if (o_.drop_last) return o_.dataset_size / o_.world_size;
  return (o_.dataset_size + o_.world_size - 1) / o_.world_size;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all(o_.dataset_size);
  std::iota(all.begin(), all.end(), 0);
  if (o_.shuffle && o_.dataset_size > 0) {
    // The same permutation on every rank, and PyTorch's: torch.randperm(n) from a CPU
    // generator seeded with seed + epoch, as torch.utils.data.DistributedSampler draws it.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(o_.seed + static_cast<uint64_t>(epoch_));
    const torch::Tensor perm = torch::randperm(o_.dataset_size, gen, torch::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + o_.dataset_size);
  }
  const int64_t total = num_samples() * o_.world_size;
  if (static_cast<int64_t>(all.size()) > total) {
    all.resize(total);  // drop_last
  } else {
    for (int64_t i = 0; static_cast<int64_t>(all.size()) < total && o_.dataset_size > 0; ++i) {
      all.push_back(all[i % o_.dataset_size]);  // pad with the first indices
    }
  }
  std::vector<int64_t> mine;
  for (int64_t i = o_.rank; i < total; i += o_.world_size) mine.push_back(all[i]);
  return mine;
}

}  // namespace dlrun::worker
