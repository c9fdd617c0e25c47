#include "unet/unet.h"

#include <torch/torch.h>

namespace dlrun::examples {
namespace {

namespace nn = torch::nn;

nn::Sequential DownConv(int64_t in, int64_t out) {
  return nn::Sequential(nn::Conv3d(nn::Conv3dOptions(in, out, 4).stride(2).padding(1)),
                        nn::LeakyReLU(nn::LeakyReLUOptions().inplace(true)));
}

nn::Sequential UpConv(int64_t in, int64_t out) {
  return nn::Sequential(
      nn::ConvTranspose3d(nn::ConvTranspose3dOptions(in, out, 4).stride(2).padding(1)),
      nn::ReLU(nn::ReLUOptions().inplace(true)));
}

}  // namespace

UNetImpl::UNetImpl(const UNetOptions& o) {
  const int64_t w = o.base_channels;
  down1_ = register_module("conv_down1", DownConv(o.in_channels, w));
  down2_ = register_module("conv_down2", DownConv(w, 2 * w));
  down3_ = register_module("conv_down3", DownConv(2 * w, 4 * w));
  down4_ = register_module("conv_down4", DownConv(4 * w, 8 * w));
  down5_ = register_module("conv_down5", DownConv(8 * w, 8 * w));
  down6_ = register_module("conv_down6", DownConv(8 * w, 8 * w));
  up6_ = register_module("conv_up6", UpConv(8 * w, 8 * w));
  up5_ = register_module("conv_up5", UpConv(16 * w, 8 * w));
  up4_ = register_module("conv_up4", UpConv(16 * w, 4 * w));
  up3_ = register_module("conv_up3", UpConv(8 * w, 2 * w));
  up2_ = register_module("conv_up2", UpConv(4 * w, w));
  last_ = register_module(
      "conv_last",
      nn::ConvTranspose3d(nn::ConvTranspose3dOptions(2 * w, o.out_channels, 4).stride(2).padding(1)));
  resetParameters();
}

void UNetImpl::resetParameters() {
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.key().find("weight") != std::string::npos) {
      p.value().normal_(0.0, 0.02);
    } else {
      p.value().zero_();
    }
  }
}

torch::Tensor UNetImpl::forward(torch::Tensor x) {
  auto c1 = down1_->forward(x);
  auto c2 = down2_->forward(c1);
  auto c3 = down3_->forward(c2);
  auto c4 = down4_->forward(c3);
  auto c5 = down5_->forward(c4);
  x = down6_->forward(c5);
  x = up6_->forward(x);
  x = up5_->forward(torch::cat({x, c5}, 1));
  x = up4_->forward(torch::cat({x, c4}, 1));
  x = up3_->forward(torch::cat({x, c3}, 1));
  x = up2_->forward(torch::cat({x, c2}, 1));
  x = last_->forward(torch::cat({x, c1}, 1));
  return torch::tanh(x);
}

}  // namespace dlrun::examples
