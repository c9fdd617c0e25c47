// The U-Net's activation checkpointing: the same forward and the same gradients as without it,
// through the recomputation in backward, for inputs and every parameter; and its forward given
// up between levels for in-process recovery.
#include <torch/torch.h>

#include "recovery/agent_word.h"  // worker/src: the agent's word, for tests
#include "dlrun/recovery.h"
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

// In-process recovery (docs/RECOVERY.md): train_unet calls dlrun::worker::interruption_point()
// between the U-Net's levels, so a survivor in the middle of a long CPU forward gives the step
// up at the next level once the agent said a peer was lost, and runs as before once the new
// generation is entered. Nothing is given up without the word.
TEST(UNetInterruption, AForwardGivesUpAtTheNextLevelOnceAPeerLossIsAnnounced) {
  for (const bool checkpoint : {false, true}) {
    UNet net(UNetOptions{4, 5, 4, checkpoint});
    int levels = 0;
    net->setBetweenLevels([&] {
      ++levels;
      dlrun::worker::interruption_point();
    });
    const torch::Tensor x = torch::randn({1, 4, 64, 64, 64});
    EXPECT_NO_THROW(net->forward(x));
    EXPECT_EQ(levels, 12) << "checkpoint " << checkpoint;
    const int next = dlrun::worker::detail::CurrentGeneration() + 1;
    dlrun::worker::detail::AnnounceForTesting({next, 12345});
    levels = 0;
    EXPECT_THROW(net->forward(x), dlrun::worker::PeerLost);
    EXPECT_EQ(levels, 1) << "given up at the first level, checkpoint " << checkpoint;
    dlrun::worker::detail::EnterGeneration(next);
    levels = 0;
    EXPECT_NO_THROW(net->forward(x));
    EXPECT_EQ(levels, 12);
  }
}

}  // namespace
}  // namespace dlrun::examples
