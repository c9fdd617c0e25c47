// The U-Net's activation checkpointing: the same forward and the same gradients as without it,
// through the recomputation in backward, for inputs and every parameter.
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "unet/unet.h"

namespace dlrun::examples {
namespace {

// Forward and backward of a fresh seeded U-Net on a fixed batch: the output and every
// parameter's gradient.
std::pair<torch::Tensor, std::vector<torch::Tensor>> Gradients(bool checkpoint) {
  torch::manual_seed(11);
  UNet net(UNetOptions{4, 5, 4, checkpoint});
  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({2, 4, 64, 64, 64});
  const torch::Tensor y = torch::tanh(torch::randn({2, 5, 64, 64, 64}));
  torch::Tensor out = net->forward(x);
  torch::l1_loss(out, y).backward();
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : net->parameters()) grads.push_back(p.grad().clone());
  return {out.detach(), grads};
}

TEST(UNetCheckpointing, TheSameOutputAndGradientsWithinOneMillionth) {
  auto [out_plain, g_plain] = Gradients(false);
  auto [out_ckpt, g_ckpt] = Gradients(true);
  EXPECT_LE((out_plain - out_ckpt).abs().max().item<double>(), 1e-6);
  ASSERT_EQ(g_plain.size(), g_ckpt.size());
  ASSERT_EQ(g_plain.size(), 24u);  // 12 layers, weight and bias: every one got a gradient
  for (size_t i = 0; i < g_plain.size(); ++i) {
    ASSERT_TRUE(g_ckpt[i].defined()) << i;
    EXPECT_GT(g_plain[i].abs().max().item<double>(), 0.0) << i;
    EXPECT_LE((g_plain[i] - g_ckpt[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
  }
}

TEST(UNetCheckpointing, NoGradForwardIsPlainAndInputGradientsFlow) {
  torch::manual_seed(11);
  UNet net(UNetOptions{4, 5, 4, true});
  const torch::Tensor x = torch::randn({1, 4, 64, 64, 64}).requires_grad_(true);
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(net->forward(x).requires_grad());
  }
  net->forward(x).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_GT(x.grad().abs().sum().item<double>(), 0.0);
}

}  // namespace
}  // namespace dlrun::examples
