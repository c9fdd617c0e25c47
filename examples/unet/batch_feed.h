// train_unet's batches (trainer_impl.h): the training and validation streams of a rank, from
// synthetic pairs or from the HDF5 files through the loader's prefetcher, each picked up where
// the steps before a resume or a recovery left it, delivered on the device (channels-last when
// asked), and on CUDA the next training batch fetched while a step computes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "unet/data.h"
#include "unet/train_args.h"

namespace train_unet_internal {

using Batch = std::pair<torch::Tensor, torch::Tensor>;

// Synthetic pairs with a learnable relation: the target is tanh of a fixed per-voxel mix of the
// input channels, so the loss falls as the model trains. Each rank draws its own samples.
// Sample i of a rank's stream is drawn from its own seed (dlrun::examples::SampleSeed), as the
// HDF5 loader's are: a batch of 2 is two micro-batches of 1, and a resume at step s (its
// samples counted) goes on with the samples the uninterrupted run drew.
struct SyntheticData {
  torch::Tensor mix;  // [out, in]
  uint64_t seed;
  int64_t size;
  int64_t next = 0;  // the index of the next sample
  SyntheticData(int64_t size, uint64_t seed, int rank, int64_t start = 0);
  std::pair<torch::Tensor, torch::Tensor> Batch(int64_t n);
};

class BatchFeed {
 public:
  // Where batches go: the device, channels-last (ChannelsLast3d) or not.
  void SetDevice(torch::Device device, bool channels_last) {
    device_ = device;
    channels_last_ = channels_last;
  }
  // Opens `rank`'s streams (`loader_threads` the loader's workers) where a run that did
  // `at_step` steps left them: the batches those steps took, and the validation batches of the
  // epochs they ended. A batch prefetched before is dropped.
  void Open(const dlrun::examples::TrainArgs& a, int64_t steps_per_epoch, int64_t val_steps,
            int rank, int loader_threads, int64_t at_step);
  // The next training batch on the device: uploaded first, then rotated there (the 24-rotation
  // augmentation) unless --rotate-in-loader.
  Batch Next();
  // The batch a micro-step trains on: on CUDA the one Prefetch fetched and copied during the
  // step before (its host-to-device copy on a side stream overlapped that step's compute).
  Batch Take();
  void Prefetch() { prefetched_ = Next(); }
  Batch NextValidation();
  bool from_files() const { return loader_ != nullptr; }

 private:
  torch::Tensor ToDevice(torch::Tensor t) const;

  int64_t batch_ = 1;  // --local-batch-size
  torch::Device device_{torch::kCPU};
  bool channels_last_ = false;
  std::unique_ptr<SyntheticData> synthetic_, synthetic_val_;
  std::unique_ptr<dlrun::examples::Prefetcher> loader_, loader_val_;
  std::optional<Batch> prefetched_;
};

}  // namespace train_unet_internal
