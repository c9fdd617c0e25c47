// DistributedSampler for LibTorch's data loaders (torch::data::make_data_loader), with the
// position in the epoch for a mid-epoch resume.
//
//   dlrun::worker::DataLoaderSampler sampler({.dataset_size = n, .rank = ctx.rank(),
//                                             .world_size = ctx.world_size(), .seed = 3});
//   auto loader = torch::data::make_data_loader(dataset, sampler,
//                                               torch::data::DataLoaderOptions(batch));
//   sampler.set_epoch(epoch);                 // before each pass over the loader
//   sampler.set_start(resumed->epoch_position);  // once, to go on mid-epoch after a resume
//   for (auto& batch : *loader) {
//     torch::mse_loss(ddp(batch.data), batch.target).backward();
//     position = sampler.position();   // this rank's samples of the epoch so far
//   }
//
// make_data_loader takes the sampler by value; the copies share one state, so calls on yours
// reach the loader's.
#pragma once

#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "dlrun/sampler.h"

namespace dlrun::worker {

class DataLoaderSampler : public torch::data::samplers::Sampler<> {
 public:
  explicit DataLoaderSampler(SamplerOptions o)
      : options_(o), state_(std::make_shared<State>(State{DistributedSampler(o)})) {}

  // Which epoch the next pass draws (the shuffle is seeded by seed + epoch, as in PyTorch).
  void set_epoch(int64_t epoch) { state_->sampler.set_epoch(epoch); }
  // The next pass starts at this rank's `position`-th index of the epoch instead of the first.
  void set_start(int64_t position) { state_->start = std::max<int64_t>(0, position); }
  // How many of this rank's indices of the epoch were handed out so far (to checkpoint).
  int64_t position() const { return state_->next; }
  const DistributedSampler& sampler() const { return state_->sampler; }

  // Sampler<>: called by the data loader at the start of each pass.
  void reset(std::optional<size_t> new_size = std::nullopt) override {
    State& s = *state_;
    if (new_size) {
      const int64_t epoch = s.sampler.epoch();
      options_.dataset_size = static_cast<int64_t>(*new_size);
      s.sampler = DistributedSampler(options_);
      s.sampler.set_epoch(epoch);
    }
    s.indices = s.sampler.indices();
    s.next = std::min<int64_t>(s.start, static_cast<int64_t>(s.indices.size()));
    s.start = 0;
  }
  std::optional<std::vector<size_t>> next(size_t batch_size) override {
    State& s = *state_;
    const int64_t left = static_cast<int64_t>(s.indices.size()) - s.next;
    if (left <= 0) return std::nullopt;
    const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(batch_size));
    std::vector<size_t> out(s.indices.begin() + s.next, s.indices.begin() + s.next + n);
    s.next += n;
    return out;
  }
  void save(torch::serialize::OutputArchive& archive) const override {
    archive.write("epoch", torch::tensor({state_->sampler.epoch()}));
    archive.write("position", torch::tensor({state_->next}));
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::Tensor epoch, position;
    archive.read("epoch", epoch);
    archive.read("position", position);
    set_epoch(epoch.item<int64_t>());
    set_start(position.item<int64_t>());
  }

 private:
  struct State {
    DistributedSampler sampler;
    std::vector<int64_t> indices;
    int64_t next = 0;
    int64_t start = 0;
  };
  SamplerOptions options_;
  std::shared_ptr<State> state_;
};

}  // namespace dlrun::worker
