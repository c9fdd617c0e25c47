// Two ranks under dlrun train the U-Net with real Gloo allreduce; their parameters must agree
// bit for bit, and must not agree when gradient sync is switched off (the negative control);
// gradient accumulation and activation checkpointing keep the gradients.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...


namespace dlrun::testing {
namespace {

nlohmann::json TrainTwoRanks(const std::vector<std::string>& extra) {
  const std::string metrics = MakeTempDir() + "/metrics.json";
  std::vector<std::string> cmd = {DLRUN_BIN,     "--standalone",    "--nproc-per-node",
                                  "2",           TRAIN_UNET_BIN,    "--synthetic",
                                  "--base-channels", "4",           "--max-steps",
                                  "3",           "--metrics-json",  metrics};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  ProcResult r = RunCommand(cmd, {{"OMP_NUM_THREADS", "1"}});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("samples/sec"), std::string::npos) << r.output;
  return nlohmann::json::parse(ReadFile(metrics));
}

TEST(TrainUnet, ParametersIdenticalOnBothRanksAfterTraining) {
  nlohmann::json m = TrainTwoRanks({});
  EXPECT_EQ(m["world_size"], 2);
  ASSERT_EQ(m["param_digests"].size(), 2u);
  EXPECT_EQ(m["param_digests"][0], m["param_digests"][1]);
  EXPECT_NE(m["param_digests"][0], m["initial_param_digest"]);  // training changed them
  EXPECT_GT(m["samples_per_sec"].get<double>(), 0.0);
}

// Gradient accumulation (--accumulation-steps): two micro-batches of 1 on each of two ranks,
// the first without gradient sync, give the step that one batch of 2 gives, within 1e-6; the
// effective global batch is counted in LR scaling and samples/s.
TEST(TrainUnet, TwoMicroBatchesOfOneEqualOneBatchOfTwo) {
  // Linear LR scaling from a base batch of 2: the effective batch decides the LR.
  const std::vector<std::string> lr = {"--lr-scaling", "linear", "--base-batch-size", "2"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), lr.begin(), lr.end());
    return v;
  };
  nlohmann::json once = TrainTwoRanks(with({"--local-batch-size", "2"}));
  nlohmann::json twice = TrainTwoRanks(with({"--local-batch-size", "1", "--accumulation-steps", "2"}));
  nlohmann::json plain = TrainTwoRanks(with({"--local-batch-size", "1"}));
  EXPECT_EQ(twice["accumulation_steps"], 2);
  EXPECT_EQ(twice["global_batch_size"], 4);
  EXPECT_EQ(once["global_batch_size"], 4);
  EXPECT_EQ(twice["param_digests"][0], twice["param_digests"][1]);  // synced on the last one
  const double g1 = once["grad_norm"].get<double>(), g2 = twice["grad_norm"].get<double>();
  EXPECT_GT(g1, 0);
  EXPECT_NEAR(g1, g2, 1e-6 * g1);
  EXPECT_NEAR(once["final_loss"].get<double>(), twice["final_loss"].get<double>(), 1e-6);
  EXPECT_NEAR(once["final_lr"].get<double>(), twice["final_lr"].get<double>(), 1e-12);
  EXPECT_NEAR(plain["final_lr"].get<double>(), once["final_lr"].get<double>() / 2, 1e-12);
  // The control: one micro-batch of 1 is another step.
  EXPECT_GT(std::abs(plain["grad_norm"].get<double>() - g1), 1e-4 * g1);
}

// --checkpoint-activations: the same gradients within 1e-6, loss within 2e-5, less peak memory: the
// most tensor memory allocated at once over the step (LibTorch's CPU allocation reports; RSS
// is blurred by what the allocator keeps). 128^3 crops, where activations dominate.
TEST(TrainUnet, ActivationCheckpointingKeepsTheGradientsAndLowersPeakMemory) {
  const std::string dir = MakeTempDir();
  nlohmann::json m[2];
  for (int i = 0; i < 2; ++i) {
    const std::string path = dir + "/m" + std::to_string(i) + ".json";
    std::vector<std::string> cmd = {TRAIN_UNET_BIN, "--synthetic", "--base-channels", "8",
                                    "--data-size", "128", "--local-batch-size", "2",
                                    "--max-steps", "1", "--measure-allocations",
                                    "--metrics-json", path};
    if (i == 1) cmd.push_back("--checkpoint-activations");
    ProcResult r = RunCommand(cmd, {{"OMP_NUM_THREADS", "2"}}, std::chrono::seconds(240));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    m[i] = nlohmann::json::parse(ReadFile(path));
  }
  EXPECT_EQ(m[1]["checkpoint_activations"], true);
  const double g = m[0]["grad_norm"].get<double>();
  EXPECT_NEAR(m[1]["grad_norm"].get<double>(), g, 1e-6 * g);
  // The loss is a float32 mean over 2 x 128^3 voxels: the two runs' sums may differ in order
  // (a loaded machine's thread split), 5e-6 of it seen once.
  const double loss = m[0]["first_loss"].get<double>();
  EXPECT_NEAR(m[1]["first_loss"].get<double>(), loss, 2e-5 * loss);
  const int64_t plain = m[0]["peak_allocated_bytes"].get<int64_t>();
  const int64_t ckpt = m[1]["peak_allocated_bytes"].get<int64_t>();
  EXPECT_GT(plain, int64_t{100} << 20);  // measured: activations and workspaces of the step
  EXPECT_LT(ckpt, plain - (int64_t{10} << 20)) << "the concatenations are not kept";
}

TEST(TrainUnet, WithoutGradientSyncRanksDiverge) {
  nlohmann::json m = TrainTwoRanks({"--no-grad-sync"});
  ASSERT_EQ(m["param_digests"].size(), 2u);
  EXPECT_NE(m["param_digests"][0], m["param_digests"][1]);
}

TEST(TrainUnet, InconsistentEnvironmentIsAClearError) {
  ProcResult r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--max-steps", "1"},
                            {{"RANK", "3"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                             {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "train_unet: RANK=3 is not below WORLD_SIZE=2\n");
  // Rank 1 of 2 whose rank 0 never comes: the error names the address and port, after the
  // (shortened) init timeout, and the torchelastic error file records it for dlrun.
  const std::string err_file = MakeTempDir() + "/error.json";
  const int port = FreeTcpPort();
  r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--max-steps", "1"},
                 {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                  {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                  {"DLRUN_INIT_TIMEOUT", "1"}, {"TORCHELASTIC_ERROR_FILE", err_file}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("cannot reach the c10d store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << r.output;
  EXPECT_NE(ReadFile(err_file).find("cannot reach the c10d store"), std::string::npos);
  r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--data-size", "48"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("multiple of 64"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dlrun::testing
