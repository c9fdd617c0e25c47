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

// The augmentation after the upload: a loader that leaves the rotations to the caller draws
// the same crops and rotations as one that applies them, and RotateBatch applies them alike.
TEST(CropSource, RotationsLeftToTheDeviceEqualTheLoadersOwn) {
  const std::string path = dlrun::testing::MakeTempDir() + "/d.h5";
  ASSERT_TRUE(WriteSyntheticFile(path, 16, 2).ok());
  auto a = CropSource::Open(path, 8, true), b = CropSource::Open(path, 8, true);
  ASSERT_TRUE(a.ok() && b.ok());
  Prefetcher on_host(std::shared_ptr<CropSource>(std::move(*a)), 1, 4, 9);
  Prefetcher deferred(std::shared_ptr<CropSource>(std::move(*b)), 1, 4, 9,
                      /*rotate_in_loader=*/false);
  std::set<int> kinds;
  for (int i = 0; i < 6; ++i) {
    auto [x, y] = on_host.Next(4);
    HostBatch d = deferred.NextBatch(4);
    ASSERT_EQ(d.rotations.size(), 4u);
    kinds.insert(d.rotations.begin(), d.rotations.end());
    EXPECT_TRUE(torch::equal(RotateBatch(d.input, d.rotations), x)) << i;
    EXPECT_TRUE(torch::equal(RotateBatch(d.target, d.rotations), y)) << i;
  }
  EXPECT_GT(kinds.size(), 3u);  // rotations drawn at random, not one for all
  EXPECT_TRUE(on_host.NextBatch(2).rotations.empty());  // rotated already
}

// Sample i comes from its own seed and the samples are handed out in order: one loader thread
// or three draw the same stream, and a stream opened at sample 6 (a resume after the steps
// that took 6) goes on as the uninterrupted one does.
TEST(CropSource, TheStreamIsTheSameForAnyThreadCountAndFromAnyStart) {
  const std::string path = dlrun::testing::MakeTempDir() + "/d.h5";
  ASSERT_TRUE(WriteSyntheticFile(path, 16, 3).ok());
  auto open = [&](int threads, int64_t start) {
    auto src = CropSource::Open(path, 8, true);
    EXPECT_TRUE(src.ok()) << src.status();
    return std::make_unique<Prefetcher>(std::shared_ptr<CropSource>(std::move(*src)), threads, 2,
                                        11, /*rotate_in_loader=*/true, start);
  };
  auto one = open(1, 0), three = open(3, 0), resumed = open(2, 6);
  std::vector<torch::Tensor> whole;
  for (int b = 0; b < 5; ++b) {
    auto [x, y] = one->Next(3);
    auto [x3, y3] = three->Next(3);
    EXPECT_TRUE(torch::equal(x, x3)) << "batch " << b;
    EXPECT_TRUE(torch::equal(y, y3)) << "batch " << b;
    whole.push_back(x);
  }
  EXPECT_FALSE(torch::equal(whole[0], whole[1]));  // a stream, not one batch over again
  for (int b = 2; b < 5; ++b) {
    EXPECT_TRUE(torch::equal(resumed->Next(3).first, whole[b])) << "batch " << b;
  }
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
