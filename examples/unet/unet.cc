#include "unet/unet.h"

#include <torch/torch.h>
#include <torch/autograd.h>

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

// Recomputation of one level in backward (torch.utils.checkpoint's reentrant variant, with the
// level's parameters passed as inputs): forward runs `fn` without building a graph and keeps
// only the inputs; backward runs it again with a graph and differentiates it with
// torch::autograd::grad, which returns the gradients of the inputs and parameters instead of
// accumulating them. The outer backward then accumulates the parameters' gradients, so their
// post-accumulate hooks (DDP's bucket all-reduce) fire as without checkpointing.
using LevelFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const LevelFn* fn, size_t n_inputs,
                                                at::TensorList tensors) {
    ctx->saved_data["fn"] = reinterpret_cast<int64_t>(fn);
    ctx->saved_data["n"] = static_cast<int64_t>(n_inputs);
    ctx->save_for_backward(tensors.vec());
    torch::NoGradGuard no_grad;
    return {(*fn)({tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(n_inputs)})};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* fn = reinterpret_cast<const LevelFn*>(ctx->saved_data["fn"].toInt());
    const auto n = static_cast<size_t>(ctx->saved_data["n"].toInt());
    torch::autograd::variable_list saved = ctx->get_saved_variables();
    std::vector<torch::Tensor> inputs, wrt;
    for (size_t i = 0; i < saved.size(); ++i) {
      if (i < n) {
        inputs.push_back(saved[i].detach().requires_grad_(saved[i].requires_grad()));
        if (saved[i].requires_grad()) wrt.push_back(inputs.back());
      } else {
        wrt.push_back(saved[i]);  // a parameter: differentiated, not accumulated
      }
    }
    torch::Tensor out;
    {
      torch::AutoGradMode grad_mode(true);
      out = (*fn)(inputs);
    }
    torch::autograd::variable_list g =
        torch::autograd::grad({out}, wrt, {grad_out[0]}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    // One gradient per forward argument: none for fn and n_inputs, then the tensors.
    torch::autograd::variable_list result{torch::Tensor(), torch::Tensor()};
    size_t k = 0;
    for (size_t i = 0; i < saved.size(); ++i) {
      result.push_back(i >= n || saved[i].requires_grad() ? g[k++] : torch::Tensor());
    }
    return result;
  }
};

}  // namespace

torch::Tensor UNetImpl::Level(const LevelFn& fn, std::vector<torch::Tensor> inputs,
                              torch::nn::Module& params_of) {
  if (!checkpoint_ || !torch::GradMode::is_enabled()) return fn(inputs);
  const size_t n = inputs.size();
  for (const torch::Tensor& p : params_of.parameters()) inputs.push_back(p);
  // A TensorList argument: autograd sees each of its tensors as an input.
  return CheckpointFunction::apply(&fn, n, at::TensorList(inputs))[0];
}

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
  checkpoint_ = o.checkpoint_activations;
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
  if (!checkpoint_ || !torch::GradMode::is_enabled()) {
    auto level = [this](auto&& fn) {
      BetweenLevels();
      return fn();
    };
    auto c1 = level([&] { return down1_->forward(x); });
    auto c2 = level([&] { return down2_->forward(c1); });
    auto c3 = level([&] { return down3_->forward(c2); });
    auto c4 = level([&] { return down4_->forward(c3); });
    auto c5 = level([&] { return down5_->forward(c4); });
    x = level([&] { return down6_->forward(c5); });
    x = level([&] { return up6_->forward(x); });
    x = level([&] { return up5_->forward(torch::cat({x, c5}, 1)); });
    x = level([&] { return up4_->forward(torch::cat({x, c4}, 1)); });
    x = level([&] { return up3_->forward(torch::cat({x, c3}, 1)); });
    x = level([&] { return up2_->forward(torch::cat({x, c2}, 1)); });
    x = level([&] { return last_->forward(torch::cat({x, c1}, 1)); });
    return torch::tanh(x);
  }
  // The same levels, each recomputed in backward. The functions live as long as the module
  // (the autograd graph holds pointers to them).
  if (levels_.empty()) {
    for (torch::nn::Sequential* m : {&down1_, &down2_, &down3_, &down4_, &down5_, &down6_, &up6_}) {
      levels_.push_back([m](const std::vector<torch::Tensor>& in) { return (*m)->forward(in[0]); });
    }
    for (torch::nn::Sequential* m : {&up5_, &up4_, &up3_, &up2_}) {
      levels_.push_back([m](const std::vector<torch::Tensor>& in) {
        return (*m)->forward(torch::cat({in[0], in[1]}, 1));
      });
    }
    levels_.push_back([this](const std::vector<torch::Tensor>& in) {
      return torch::tanh(last_->forward(torch::cat({in[0], in[1]}, 1)));
    });
  }
  std::vector<torch::Tensor> c{x};
  torch::nn::Module* down[] = {down1_.ptr().get(), down2_.ptr().get(), down3_.ptr().get(),
                               down4_.ptr().get(), down5_.ptr().get(), down6_.ptr().get()};
  for (int i = 0; i < 6; ++i) {
    BetweenLevels();
    c.push_back(Level(levels_[i], {c.back()}, *down[i]));
  }
  BetweenLevels();
  x = Level(levels_[6], {c[6]}, *up6_);
  torch::nn::Module* up[] = {up5_.ptr().get(), up4_.ptr().get(), up3_.ptr().get(), up2_.ptr().get()};
  for (int i = 0; i < 4; ++i) {
    BetweenLevels();
    x = Level(levels_[7 + i], {x, c[5 - i]}, *up[i]);
  }
  BetweenLevels();
  // The last level is not recomputed: its backward runs first, at the peak, where recomputing
  // would hold its activations twice (the kept output and the recomputed one) and save nothing.
  return levels_[11]({x, c[1]});
}

}  // namespace dlrun::examples
