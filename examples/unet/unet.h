// The 3D U-Net of the SC22 "Deep Learning at Scale" tutorial (networks/UNet.py), in LibTorch.
// Six Conv3d(k=4, s=2, p=1) + LeakyReLU down-blocks (4 -> w -> 2w -> 4w -> 8w -> 8w -> 8w),
// five ConvTranspose3d + ReLU up-blocks with skip concatenations, a last ConvTranspose3d to the
// output channels and tanh. w = 64 is the tutorial's model (117 M parameters).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <functional>
#include <vector>

namespace dlrun::examples {

struct UNetOptions {
  int64_t in_channels = 4;
  int64_t out_channels = 5;
  int64_t base_channels = 64;
  // Activation checkpointing: each level (a down-block; a skip concatenation with its
  // up-block) keeps only its inputs for backward and computes its inside again there, trading
  // one more forward for the memory of what it would have saved (the concatenations, the
  // blocks' activations). The last layer runs as usual: its backward comes first, at the
  // peak, so recomputing it would save nothing.
  bool checkpoint_activations = false;
};

class UNetImpl : public torch::nn::Module {
 public:
  explicit UNetImpl(const UNetOptions& o = {});
  torch::Tensor forward(torch::Tensor x);
  // Weights ~ N(0, 0.02), biases 0, as the tutorial's get_weights_function.
  void resetParameters();
  // The spatial size must be a multiple of 64 (six stride-2 down-samplings to 1).
  static constexpr int64_t kSizeMultiple = 64;
  void setCheckpointActivations(bool on) { checkpoint_ = on; }
  // Called between the levels of forward (the trainer passes dlrun::worker::interruption_point,
  // so a step given up for a lost peer stops within a level, not at the end of forward).
  void setBetweenLevels(std::function<void()> fn) { between_levels_ = std::move(fn); }

 private:
  // One level: `fn` on `inputs`, through CheckpointFunction when checkpointing.
  torch::Tensor Level(const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& fn,
                      std::vector<torch::Tensor> inputs, torch::nn::Module& params_of);
  void BetweenLevels() const {
    if (between_levels_) between_levels_();
  }
  bool checkpoint_ = false;
  std::function<void()> between_levels_;
  std::vector<std::function<torch::Tensor(const std::vector<torch::Tensor>&)>> levels_;
  torch::nn::Sequential down1_{nullptr}, down2_{nullptr}, down3_{nullptr}, down4_{nullptr},
      down5_{nullptr}, down6_{nullptr};
  torch::nn::Sequential up6_{nullptr}, up5_{nullptr}, up4_{nullptr}, up3_{nullptr},
      up2_{nullptr};
  torch::nn::ConvTranspose3d last_{nullptr};
};
TORCH_MODULE(UNet);

}  // namespace dlrun::examples
