// dlrun::worker::SyncBatchNorm: BatchNorm whose training statistics (mean and variance) are those
// of the whole global batch, every rank's share together, as PyTorch's nn.SyncBatchNorm (whose
// Python version runs on GPUs only; this one also runs on the CPU over Gloo). For small
// per-rank batches, where one rank's statistics are too noisy. Evaluation uses the running
// statistics, which every rank updates alike from the global figures.
//
//   struct NetImpl : torch::nn::Module {
//     explicit NetImpl(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
//       conv = register_module("conv", torch::nn::Conv2d(3, 16, 3));
//       bn = register_module("bn", dlrun::worker::SyncBatchNorm(16, pg));  // not BatchNorm2d(16)
//     }
//     torch::Tensor forward(torch::Tensor x) { return torch::relu(bn(conv(x))); }
//     torch::nn::Conv2d conv{nullptr};
//     dlrun::worker::SyncBatchNorm bn{nullptr};
//   };
//
// Its parameters and buffers have BatchNorm's names (weight, bias, running_mean, running_var,
// num_batches_tracked), so a checkpoint moves between the two. Any input of shape [N, C, ...]
// works (BatchNorm1d, 2d and 3d alike). Each training forward and backward is one allreduce on
// the process group; every rank must call forward the same number of times, as with DDP.
//
// After an in-process recovery (docs/RECOVERY.md) the old group is gone: rebuild_after_recovery
// (dlrun/ddp.h) moves every SyncBatchNorm of the model it wraps onto the new group; a trainer
// without the DDP wrapper calls use_group itself:
//
//   if (r.recovered) dlrun::worker::use_group(*model, ctx.pg);
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

namespace dlrun::worker {

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(int64_t num_features, c10::intrusive_ptr<c10d::ProcessGroup> pg)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features), std::move(pg)) {}
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                    c10::intrusive_ptr<c10d::ProcessGroup> pg);

  torch::Tensor forward(const torch::Tensor& input);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  torch::nn::BatchNormOptions options;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(SyncBatchNorm);

// Every SyncBatchNorm in `module` (itself included) normalizes over `pg` from now on; returns
// how many there were.
int use_group(torch::nn::Module& module, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

}  // namespace dlrun::worker
