// train_unet's own modes: channels-last on the CPU, the tutorial's config with epochs and
// validation, benchy's throughput trials and the density loss term.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

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

TEST(TrainUnet, ChannelsLastOnTheCpuTrainsAndDeviceFlagsAreChecked) {
  const std::string dir = MakeTempDir();
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "2", TRAIN_UNET_BIN, "--synthetic",
                             "--base-channels", "4", "--max-steps", "3", "--channels-last",
                             "--device", "cpu", "--metrics-json", dir + "/m.json"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device cpu, channels-last"), std::string::npos) << r.output;
  auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
  EXPECT_EQ(m["param_digests"][0], m["param_digests"][1]);
  EXPECT_LT(m["final_loss"].get<double>(), m["first_loss"].get<double>());
  r = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--device", "tpu"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--device"), std::string::npos) << r.output;
}

TEST(TrainUnet, TutorialStyleConfigRunsEpochsWithValidation) {
  const std::string yaml = std::string(SOURCE_DIR) + "/examples/unet/config/UNet.yaml";
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "2", TRAIN_UNET_BIN, "--yaml-config",
                             yaml, "--config", "cpu_tiny", "--base-channels", "4"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // cpu_tiny: 2 epochs of 8 samples over a global batch of 2 -> 4 steps each, validation each.
  EXPECT_NE(r.output.find("Time taken for epoch 1 is"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Time taken for epoch 2 is"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Time taken for epoch 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 8/8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Avg val loss="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("base width 4"), std::string::npos);  // the flag overrides the config
  // --num-epochs over the configuration's; --target-loss: reached at the first epoch's end for
  // a loss any model reaches, never for one none does.
  const std::string dir = MakeTempDir();
  for (const char* target : {"10", "1e-9"}) {
    r = RunCommand({TRAIN_UNET_BIN, "--yaml-config", yaml, "--config", "cpu_tiny",
                    "--base-channels", "4", "--num-epochs", "3", "--no-tf32", "--target-loss",
                    target, "--metrics-json", dir + "/m.json"},
                   {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Time taken for epoch 3 is"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 12/12"), std::string::npos) << r.output;
    auto m = nlohmann::json::parse(ReadFile(dir + "/m.json"));
    if (std::string(target) == "10") {
      EXPECT_EQ(m["target_loss_step"], 4) << m.dump();  // 8 samples / batch 2 per epoch
      EXPECT_EQ(m["target_loss_of"], "validation");
      EXPECT_GT(m["target_loss_s"].get<double>(), 0);
      EXPECT_NE(r.output.find("target loss 10 reached at step 4"), std::string::npos) << r.output;
    } else {
      EXPECT_TRUE(m["target_loss_step"].is_null()) << m.dump();
    }
  }
  r = RunCommand({TRAIN_UNET_BIN, "--yaml-config", yaml, "--config", "nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("no configuration 'nope'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dlrun::testing

namespace dlrun::testing {
namespace {

TEST(TrainUnet, BenchyTrialsAndTheDensityLossTerm) {
  ProcResult r = RunCommand({DLRUN_BIN, "--nproc-per-node", "2", TRAIN_UNET_BIN, "--synthetic",
                             "--base-channels", "4", "--max-steps", "2", "--benchy",
                             "--benchy-trials", "3"},
                            {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Three trials per mode, then each mode's mean +/- spread.
  for (const char* mode : {"IO", "SYNTHETIC", "FULL"}) {
    EXPECT_NE(r.output.find(std::string("BENCHY::") + mode + " trial 3: "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(std::string("BENCHY::") + mode + " trial 4: "), std::string::npos);
  }
  EXPECT_NE(r.output.find(" +/- "), std::string::npos) << r.output;
  for (const char* line : {"BENCHY::SUMMARY::IO average trial throughput: ",
                           "BENCHY::SUMMARY:: SYNTHETIC average trial throughput: ",
                           "BENCHY::SUMMARY::FULL average trial throughput: ", "FULL is bounded by"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  // lambda_rho adds a non-negative term: the same first step has a larger loss with it. Run
  // alone (no launcher), with MASTER_PORT held by another program: a single process has no one
  // to meet and its store takes a free port (this test failed with EADDRINUSE on 29500 when a
  // parallel test held it).
  const std::string dir = MakeTempDir();
  const int held_port = FreeTcpPort();
  const int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(held_port));
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(held, 1), 0);
  double first[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const std::string m = dir + "/m" + std::to_string(i) + ".json";
    ProcResult t = RunCommand({TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4",
                               "--max-steps", "1", "--lambda-rho", i ? "0.5" : "0",
                               "--metrics-json", m},
                              {{"OMP_NUM_THREADS", "1"}, {"MASTER_ADDR", "127.0.0.1"},
                               {"MASTER_PORT", std::to_string(held_port)}},
                              std::chrono::seconds(120));
    ASSERT_EQ(t.exit_code, 0) << t.output;
    first[i] = nlohmann::json::parse(ReadFile(m))["first_loss"].get<double>();
  }
  EXPECT_GT(first[1], first[0]);
  close(held);
}

}  // namespace
}  // namespace dlrun::testing
