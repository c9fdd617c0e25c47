// DDP pieces in one process: bucket layout against PyTorch's, and the two-rank checks run
// under dlrun (ddp_check).
#include <torch/torch.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "dlrun/ddp.h"
#include "dlrun/worker.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "unet/unet.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::worker {
namespace {

c10::intrusive_ptr<c10d::ProcessGroup> SoloGroup() {
  return make_gloo_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, "127.0.0.1");
}

// Expected counts from PyTorch 2.15's own dist._compute_bucket_assignment_by_size on the same
// U-Net (bench/unet_ddp.py's, parameters in reverse registration order), caps [1 MiB,
// bucket_cap_mb] (1.13 gave the same). 2.x's DDP starts with one bucket (when
// find_unused_parameters is off) and re-packs with these caps in ready order after the first
// backward, which for this U-Net is reverse registration order: dlrun's first layout is 2.x's
// layout from the second step on.
//   width 64: cap 1 -> 11 buckets, 25 -> 8, 100 -> 5;  width 16: 8, 3, 2.
TEST(DdpBuckets, UNetBucketCountsMatchPyTorch) {
  auto pg = SoloGroup();
  for (auto [width, expected] : std::vector<std::pair<int, std::vector<size_t>>>{
           {16, {8, 3, 2}}, {64, {11, 8, 5}}}) {
    auto unet = dlrun::examples::UNet(dlrun::examples::UNetOptions{4, 5, width});
    const double caps[] = {1, 25, 100};
    for (int i = 0; i < 3; ++i) {
      DDPOptions o;
      o.bucket_cap_mb = caps[i];
      DistributedDataParallel ddp(unet.ptr(), pg, o);
      EXPECT_EQ(ddp.buckets().size(), expected[i]) << "width " << width << " cap " << caps[i]
                                                   << ": " << ddp.bucket_report();
      // Ready order: the last layer's gradients come first; the first layers share the small
      // last bucket.
      const auto& first = ddp.buckets().front().parameters;
      const auto& last = ddp.buckets().back().parameters;
      EXPECT_EQ(first.front(), "conv_last.bias");
      EXPECT_NE(std::find(first.begin(), first.end(), "conv_last.weight"), first.end());
      EXPECT_EQ(last.back(), "conv_down1.0.weight");
    }
  }
}

TEST(DdpBuckets, AssignmentRules) {
  // 3 x 0.6 MiB with caps [1 MiB, 1 MiB]: [0,1] then [2], reversed into ready order.
  const int64_t mb = 1024 * 1024;
  auto b = assign_buckets({6 * mb / 10, 6 * mb / 10, 6 * mb / 10}, mb, mb);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], (std::vector<size_t>{2}));
  EXPECT_EQ(b[1], (std::vector<size_t>{0, 1}));
  // One parameter above the cap gets a bucket of its own.
  b = assign_buckets({10, 5 * mb, 10}, mb, mb);
  EXPECT_EQ(b.size(), 2u);
  // The rebuild keeps the observed order, inside buckets too; the first bucket has the small cap.
  b = assign_buckets_in_ready_order({6 * mb / 10, 6 * mb / 10, 6 * mb / 10, 6 * mb / 10}, {2, 0, 3, 1},
                                mb / 2, mb);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::vector<size_t>{2}));
  EXPECT_EQ(b[1], (std::vector<size_t>{0, 3}));
  EXPECT_EQ(b[2], (std::vector<size_t>{1}));
}

std::string RunCheck(const std::string& mode, int* rc, const std::string& shm = "1") {
  testing::ProcResult r = testing::RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", DDP_CHECK_BIN, "--mode", mode},
      {{"OMP_NUM_THREADS", "1"}, {"DLRUN_DDP_SHM", shm}}, std::chrono::seconds(120));
  *rc = r.exit_code;
  return r.output;
}

class DdpTwoRanks : public ::testing::TestWithParam<std::string> {};

TEST_P(DdpTwoRanks, MatchesTheSingleProcessReference) {
  int rc = -1;
  const std::string out = RunCheck(GetParam(), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[rank 0]: ddp_check ok"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1]: ddp_check ok"), std::string::npos) << out;
}

// Ranks on one host sum buckets through shared memory; DLRUN_DDP_SHM=0 (or ranks on several
// hosts) uses Gloo. Both must match the single-process reference, and no segment is left.
TEST(DdpTwoRanks, SharedMemoryAndGlooBothMatchTheReference) {
  int rc = -1;
  std::string out = RunCheck("adam", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("allreduce: shared memory"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1]: ddp_check ok"), std::string::npos) << out;
  // The segment is named after rank 0's pid (the agent's rank table: "  0  0  PID"); other
  // tests running beside this one hold segments of their own.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("\\n  0 +0 +([0-9]+)\\n"))) << out;
  const std::string segment = "dlrun-ddp-" + m[1].str() + "-";
  out = RunCheck("adam", &rc, "0");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("allreduce: gloo"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1]: ddp_check ok"), std::string::npos) << out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_EQ(e.path().filename().string().rfind(segment, 0), std::string::npos)
        << "left behind: " << e.path();
  }
}

// Ranks with different DDPOptions (a bucket cap of 25 MB on rank 0, 5 on rank 1): one line
// on every rank naming the setting and both values, and the job ends, on the shared-memory
// path and on Gloo (it used to hang on the first, and abort on a size mismatch on the second).
TEST(DdpTwoRanks, DifferentBucketCapsAreOneLineOnEveryRankNotAHang) {
  for (const char* shm : {"1", "0"}) {
    int rc = -1;
    const std::string out = RunCheck("mismatch", &rc, shm);
    EXPECT_EQ(rc, 0) << out;  // each rank exits 0 once refused, 1 if DDP was built
    for (const char* rank : {"[rank 0]", "[rank 1]"}) {
      EXPECT_NE(out.find(std::string(rank) +
                         ": ddp_check refused: DistributedDataParallel: DDPOptions::bucket_cap_mb "
                         "differs across ranks (rank 0 has 25, rank 1 has 5); every rank must "
                         "build DDP with the same options"),
                std::string::npos)
          << "DLRUN_DDP_SHM=" << shm << "\n" << out;
    }
  }
}

// A communication hook on rank 1 only, registered after the construction: one line on every
// rank at the first forward, on the shared-memory path too (it hung in the shared-memory wait).
TEST(DdpTwoRanks, AHookOnOneRankOnlyIsOneLineOnEveryRankNotAHang) {
  for (const char* shm : {"1", "0"}) {
    int rc = -1;
    const std::string out = RunCheck("hook-mismatch", &rc, shm);
    EXPECT_EQ(rc, 0) << out;
    for (const char* rank : {"[rank 0]", "[rank 1]"}) {
      EXPECT_NE(out.find(std::string(rank) +
                         ": ddp_check refused: DistributedDataParallel: the communication hook "
                         "differs across ranks: rank(s) 1 have another one than rank 0"),
                std::string::npos)
          << "DLRUN_DDP_SHM=" << shm << "\n" << out;
    }
    // The hook by PyTorch's name, not its mangled C++ type.
    EXPECT_NE(out.find("rank 1 has a fp16_compress_hook)"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 0 has none)"), std::string::npos) << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, DdpTwoRanks,
                         ::testing::Values("adam", "nosync", "nosync-forward", "buffers-on",
                                           "buffers-off",
                                           "unused-error", "unused-ok", "reload",
                                           "reorder", "fp16", "hook", "syncbn", "init-sync",
                                           "ready-order"));

std::vector<double> ReadDoubles(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<double> v;
  double d = 0;
  while (in.read(reinterpret_cast<char*>(&d), sizeof d)) v.push_back(d);
  return v;
}

// PyTorch's own DistributedDataParallel (tests/worker/ddp_twin.py, Python, torch 2.15) and
// dlrun's (ddp_check's twin modes) train the same model from the same values on the same data,
// two ranks each under dlrun: every rank ends with the same parameters, to 1e-6 of the largest.
// fp16/bf16: PyTorch's compression hooks against comm_hooks::fp16_compress/bf16_compress;
// static: static_graph with a parameter forward never uses; join: rank r has 5 + 2r batches.
class DdpTwin : public ::testing::TestWithParam<std::string> {};

TEST_P(DdpTwin, EndsWhereThePythonDdpOfPyTorchEnds) {
  if (testing::RunCommand({TEST_PYTHON, "-c", "import torch.distributed"}, {},
                          std::chrono::seconds(60)).exit_code != 0) {
    GTEST_SKIP() << "torch is needed: " << TEST_PYTHON << " (scripts/install-deps)";
  }
  const std::string dir = testing::MakeTempDir();
  const std::map<std::string, std::string> env = {
      {"OMP_NUM_THREADS", "1"}, {"PYTHON_EXEC", TEST_PYTHON}};
  testing::ProcResult cc = testing::RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", DDP_CHECK_BIN, "--mode",
       "twin-" + GetParam(), "--out", dir}, env, std::chrono::seconds(120));
  ASSERT_EQ(cc.exit_code, 0) << cc.output;
  testing::ProcResult py = testing::RunCommand(
      {DLRUN_BIN, "--standalone", "--nproc-per-node", "2", DDP_TWIN_PY, "--mode", GetParam(),
       "--out", dir}, env, std::chrono::seconds(180));
  ASSERT_EQ(py.exit_code, 0) << py.output;
  std::vector<std::vector<double>> ours;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    const std::vector<double> c = ReadDoubles(dir + "/cc-rank" + r + ".bin");
    const std::vector<double> p = ReadDoubles(dir + "/py-rank" + r + ".bin");
    ASSERT_FALSE(c.empty()) << cc.output;
    ASSERT_EQ(c.size(), p.size()) << "rank " << rank << ": parameter counts differ";
    double worst = 0, scale = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      worst = std::max(worst, std::abs(c[i] - p[i]));
      scale = std::max(scale, std::abs(p[i]));
    }
    EXPECT_LE(worst, 1e-6 * scale) << GetParam() << ", rank " << rank << "\n" << cc.output;
    ours.push_back(c);
  }
  // Every rank ends with the same parameters (join: the last rank to finish's, broadcast).
  EXPECT_EQ(ours[0], ours[1]) << cc.output;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Features, DdpTwin,
                         ::testing::Values("fp16", "bf16", "static", "join"));

}  // namespace
}  // namespace dlrun::worker
