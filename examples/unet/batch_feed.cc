// train_unet's batches (batch_feed.h).
#include "unet/batch_feed.h"

#include <stdexcept>
#include <string>

#include "unet/gpu.h"

namespace train_unet_internal {

SyntheticData::SyntheticData(int64_t size, uint64_t seed, int rank, int64_t start)
    : seed(seed * 7919 + rank + 1), size(size), next(start) {
  torch::manual_seed(seed);
  mix = torch::randn({5, 4}) * 0.5;
}

std::pair<torch::Tensor, torch::Tensor> SyntheticData::Batch(int64_t n) {
  std::vector<torch::Tensor> xs;
  for (int64_t i = 0; i < n; ++i) {
    auto gen =
        torch::make_generator<torch::CPUGeneratorImpl>(dlrun::examples::SampleSeed(seed, next++));
    xs.push_back(torch::randn({4, size, size, size}, gen));
  }
  auto x = torch::stack(xs);
  auto y = torch::tanh(torch::einsum("oi,nidhw->nodhw", {mix, x}));
  return {x, y};
}

void BatchFeed::Open(const dlrun::examples::TrainArgs& a, int64_t steps_per_epoch,
                     int64_t val_steps, int rank, int loader_threads, int64_t at_step) {
  batch_ = a.local_batch_size;
  prefetched_.reset();
  const int64_t train_batches = at_step * a.accumulation_steps;
  const int64_t val_batches = at_step / steps_per_epoch * val_steps;
  auto open_loader = [&](const std::string& path, uint64_t seed, int64_t batches) {
    auto src = dlrun::examples::CropSource::Open(path, a.data_size, a.data_mode == "inmem");
    if (!src.ok()) throw std::runtime_error(std::string(src.status().message()));
    return std::make_unique<dlrun::examples::Prefetcher>(
        std::shared_ptr<dlrun::examples::CropSource>(std::move(*src)), loader_threads,
        a.prefetch_factor, seed, /*rotate_in_loader=*/!a.rotate_on_device,
        /*start=*/batches * batch_);
  };
  if (a.data.empty()) {
    synthetic_ = std::make_unique<SyntheticData>(a.data_size, a.seed, rank, train_batches * batch_);
    if (a.nsamples_val > 0) {
      synthetic_val_ =
          std::make_unique<SyntheticData>(a.data_size, a.seed, 7777 + rank, val_batches * batch_);
    }
  } else {
    loader_ = open_loader(a.data, a.seed * 7919 + rank + 1, train_batches);
    if (a.nsamples_val > 0) {
      loader_val_ = open_loader(a.val_path.empty() ? a.data : a.val_path, a.seed * 31 + rank + 1,
                                val_batches);
    }
  }
}

torch::Tensor BatchFeed::ToDevice(torch::Tensor t) const {
  t = dlrun::examples::ToDeviceAsync(t, device_);
  return channels_last_ ? t.contiguous(torch::MemoryFormat::ChannelsLast3d) : t;
}

Batch BatchFeed::Next() {
  if (!loader_) {
    Batch b = synthetic_->Batch(batch_);
    return {ToDevice(b.first), ToDevice(b.second)};
  }
  dlrun::examples::HostBatch b = loader_->NextBatch(batch_);
  auto rotated = [&](const torch::Tensor& t) {
    return ToDevice(
        dlrun::examples::RotateBatch(dlrun::examples::ToDeviceAsync(t, device_), b.rotations));
  };
  return {rotated(b.input), rotated(b.target)};
}

Batch BatchFeed::Take() {
  if (prefetched_) {
    Batch b = std::move(*prefetched_);
    prefetched_.reset();
    return b;
  }
  return Next();
}

Batch BatchFeed::NextValidation() {
  Batch b = loader_val_ ? loader_val_->Next(batch_) : synthetic_val_->Batch(batch_);
  return {ToDevice(b.first), ToDevice(b.second)};
}

}  // namespace train_unet_internal
