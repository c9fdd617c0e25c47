// The trainer's GradScaler and GPU-path choices, checked on the CPU.
#include <hdf5.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "unet/data.h"


#include "unet/gpu.h"

namespace dlrun::examples {
namespace {

TEST(GradScaler, UnscalesSkipsOverflowsAndAdaptsTheScale) {
  GradScaler s(true, 8.0, 2);
  auto p = torch::zeros({2}, torch::requires_grad());
  p.mutable_grad() = torch::tensor({8.0f, 16.0f});
  EXPECT_DOUBLE_EQ(s.scale(torch::tensor(2.0f)).item<double>(), 16.0);
  EXPECT_TRUE(s.unscale({p}));
  EXPECT_TRUE(torch::equal(p.grad(), torch::tensor({1.0f, 2.0f})));
  s.update(true);
  EXPECT_DOUBLE_EQ(s.currentScale(), 8.0);
  s.update(true);  // two finite steps: grow
  EXPECT_DOUBLE_EQ(s.currentScale(), 16.0);
  p.mutable_grad() = torch::tensor({1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(s.unscale({p}));
  s.update(false);  // overflow: back off, and the growth count starts again
  EXPECT_DOUBLE_EQ(s.currentScale(), 8.0);
  p.mutable_grad() = torch::tensor({1.0f, std::nanf("")});
  EXPECT_FALSE(s.unscale({p}));

  GradScaler off(false);
  EXPECT_DOUBLE_EQ(off.scale(torch::tensor(2.0f)).item<double>(), 2.0);
  p.mutable_grad() = torch::tensor({1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(off.unscale({p}));  // disabled: never skips, never touches the gradients
  EXPECT_EQ(p.grad()[0].item<float>(), 1.0f);
}

TEST(GpuPath, DeviceChoiceAndChannelsLastOnTheCpu) {
  EXPECT_TRUE(PickDevice("cpu", 0).is_cpu());
  if (!torch::cuda::is_available()) {
    EXPECT_TRUE(PickDevice("auto", 3).is_cpu());
    try {
      PickDevice("cuda", 0);
      ADD_FAILURE() << "--device cuda without a GPU must fail";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("--device cuda: no GPU is usable"), std::string::npos);
    }
  }
  try {
    PickDevice("tpu", 0);
    ADD_FAILURE() << "a bad --device must fail";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("invalid value 'tpu' for --device"), std::string::npos);
  }
  torch::nn::Conv3d conv(torch::nn::Conv3dOptions(2, 3, 4));
  torch::Tensor w = conv->weight;
  const auto before = conv->forward(torch::ones({1, 2, 8, 8, 8}));
  ToChannelsLast(conv->parameters());
  EXPECT_TRUE(conv->weight.is_contiguous(torch::MemoryFormat::ChannelsLast3d));
  EXPECT_TRUE(conv->weight.is_same(w));  // the same parameter object: optimizers keep it
  // The same numbers up to summation order: a channels-last convolution may take another kernel
  // (oneDNN on one CPU, the native one on another), so the last bits differ by machine; a wrong
  // layout would differ in the first digit.
  const auto after = conv->forward(torch::ones({1, 2, 8, 8, 8}));
  EXPECT_TRUE(torch::allclose(after, before, /*rtol=*/1e-4, /*atol=*/1e-5))
      << "largest difference " << (after - before).abs().max().item<float>();
}

}  // namespace
}  // namespace dlrun::examples
