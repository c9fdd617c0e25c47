#include "dlrun/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>
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

int64_t DistributedSampler::numSamples() const {
  if (o_.drop_last) return o_.dataset_size / o_.world_size;
  return (o_.dataset_size + o_.world_size - 1) / o_.world_size;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all(o_.dataset_size);
  std::iota(all.begin(), all.end(), 0);
  if (o_.shuffle) {
    // The same permutation on every rank: seeded by seed + epoch only.
    std::mt19937_64 gen(o_.seed + static_cast<uint64_t>(epoch_));
    for (int64_t i = o_.dataset_size - 1; i > 0; --i) {
      std::uniform_int_distribution<int64_t> pick(0, i);
      std::swap(all[i], all[pick(gen)]);
    }
  }
  const int64_t total = numSamples() * o_.world_size;
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
