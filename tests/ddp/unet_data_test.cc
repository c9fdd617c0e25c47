// The U-Net data pipeline: the 24 rotations, HDF5 crops and their error messages.
#include <hdf5.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "unet/data.h"

namespace dlrun::examples {
namespace {

TEST(Rotations, TwentyFourDistinctProperRotationsAppliedAlikeToInputAndTarget) {
  torch::manual_seed(3);
  const auto cube = torch::randn({2, 5, 5, 5});
  std::vector<torch::Tensor> seen;
  for (int k = 0; k < 24; ++k) {
    auto r = Rotate24(cube, k);
    EXPECT_EQ(r.sizes(), cube.sizes());
    for (const auto& s : seen) EXPECT_FALSE(torch::equal(r, s)) << "rotation " << k << " repeats";
    seen.push_back(r);
    // Input and target of one sample get the same rotation: rotating them stacked equals
    // rotating each.
    auto input = torch::randn({4, 3, 3, 3}), target = torch::randn({5, 3, 3, 3});
    auto both = Rotate24(torch::cat({input, target}), k);
    EXPECT_TRUE(torch::equal(both.narrow(0, 0, 4), Rotate24(input, k)));
    EXPECT_TRUE(torch::equal(both.narrow(0, 4, 5), Rotate24(target, k)));
  }
  // Proper rotations only: a mirror image (one flipped axis) is not among them.
  auto mirrored = cube.flip({3});
  for (const auto& s : seen) EXPECT_FALSE(torch::equal(mirrored, s));
  EXPECT_TRUE(torch::equal(seen[0], cube));  // the identity is one of them
}

TEST(CropSource, ReadsCropsInMemoryAndFromFileAlike) {
  const std::string path = dlrun::testing::MakeTempDir() + "/d.h5";
  ASSERT_TRUE(WriteSyntheticFile(path, 16, 1).ok());
  auto mem = CropSource::Open(path, 8, true);
  auto low = CropSource::Open(path, 8, false);
  ASSERT_TRUE(mem.ok()) << mem.status();
  ASSERT_TRUE(low.ok()) << low.status();
  auto a = (*mem)->Crop(3, 5, 8), b = (*low)->Crop(3, 5, 8);
  EXPECT_EQ(a.input.sizes(), (std::vector<int64_t>{4, 8, 8, 8}));
  EXPECT_EQ(a.target.sizes(), (std::vector<int64_t>{5, 8, 8, 8}));
  EXPECT_TRUE(torch::equal(a.input, b.input));
  EXPECT_TRUE(torch::equal(a.target, b.target));
  Prefetcher p(std::shared_ptr<CropSource>(std::move(*mem)), 2, 2, 7);
  auto [x, y] = p.Next(3);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{3, 4, 8, 8, 8}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 8, 8, 8}));
}

void WriteDataset(hid_t f, const char* name, std::vector<hsize_t> dims) {
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t ds = H5Dcreate2(f, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(ds);
  H5Sclose(space);
}

TEST(CropSource, BadFilesAreClearErrors) {
  const std::string dir = dlrun::testing::MakeTempDir();
  auto expect_error = [](const std::string& path, int64_t size, const std::string& needle) {
    auto s = CropSource::Open(path, size, false);
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_NE(std::string(s.status().message()).find(needle), std::string::npos) << s.status();
  };
  expect_error(dir + "/missing.h5", 8, "missing or not an HDF5 file");
  {
    hid_t f = H5Fcreate((dir + "/no_hydro.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    WriteDataset(f, "Nbody", {4, 8, 8, 8});
    H5Fclose(f);
  }
  expect_error(dir + "/no_hydro.h5", 8, "no dataset Hydro");
  {
    hid_t f = H5Fcreate((dir + "/shape.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    WriteDataset(f, "Nbody", {3, 8, 8, 8});
    WriteDataset(f, "Hydro", {5, 8, 8, 8});
    H5Fclose(f);
  }
  expect_error(dir + "/shape.h5", 8, "Nbody has shape [3, 8, 8, 8]");
  ASSERT_TRUE(WriteSyntheticFile(dir + "/ok.h5", 8, 1).ok());
  expect_error(dir + "/ok.h5", 16, "--data-size 16 is larger than the box");
}

}  // namespace
}  // namespace dlrun::examples

#include "unet/tensorboard.h"

namespace dlrun::examples {
namespace {

TEST(TensorBoard, Crc32cKnownVector) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the standard CRC-32C check value
}

TEST(TensorBoard, EventFileIsValidTfRecordsWithOurScalars) {
  const std::string dir = dlrun::testing::MakeTempDir();
  std::string path;
  {
    auto w = EventWriter::Open(dir);
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->Scalar("train/loss", 0.25f, 3);
    (*w)->Scalar("val/loss", 0.5f, 4);
    path = (*w)->path();
  }
  EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
  const std::string bytes = dlrun::testing::ReadFile(path);
  auto masked = [](uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
  size_t off = 0;
  std::vector<std::string> records;
  while (off < bytes.size()) {
    ASSERT_LE(off + 12, bytes.size());
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + off, 8);
    std::memcpy(&len_crc, bytes.data() + off + 8, 4);
    EXPECT_EQ(len_crc, masked(Crc32c(bytes.data() + off, 8)));
    ASSERT_LE(off + 12 + len + 4, bytes.size());
    std::memcpy(&data_crc, bytes.data() + off + 12 + len, 4);
    EXPECT_EQ(data_crc, masked(Crc32c(bytes.data() + off + 12, len)));
    records.push_back(bytes.substr(off + 12, len));
    off += 12 + len + 4;
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  const float v = 0.25f;
  EXPECT_NE(records[1].find(std::string("\x15", 1) + std::string(reinterpret_cast<const char*>(&v), 4)),
            std::string::npos);  // simple_value, field 2, fixed32
  EXPECT_NE(records[2].find("val/loss"), std::string::npos);
}

}  // namespace
}  // namespace dlrun::examples

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
  EXPECT_TRUE(torch::allclose(conv->forward(torch::ones({1, 2, 8, 8, 8})), before));
}

}  // namespace
}  // namespace dlrun::examples
