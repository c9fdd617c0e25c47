#include "launcher/workers/worker_env.h"

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

TEST(WorkerEnv, TorchrunContract) {
  Assignment a;
  a.node_rank = 1;
  a.num_nodes = 2;
  a.rank_offset = 4;
  a.world_size = 8;
  a.local_world_size = 4;
  a.master_addr = "10.0.0.1";
  a.master_port = 1234;
  a.restart_count = 2;
  a.max_restarts = 3;
  a.run_id = "job42";
  auto env = BuildWorkerEnv(a, 3, "/tmp/e.json", 2);
  EXPECT_EQ(env["RANK"], "7");
  EXPECT_EQ(env["LOCAL_RANK"], "3");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["ROLE_RANK"], "7");
  EXPECT_EQ(env["ROLE_NAME"], "default");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "8");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "1234");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job42");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/tmp/e.json");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "2");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["DLRUN_NCCL_ERROR_HANDLING_DEFAULT"], "1");
}

TEST(WorkerEnv, OmpThreadsLeftAloneWhenZero) {
  auto env = BuildWorkerEnv(Assignment{}, 0, "", 0);
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(env.count("TORCHELASTIC_ERROR_FILE"), 0u);
  EXPECT_EQ(env["RANK"], "0");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
}

TEST(WorkerEnv, VirtualLocalRankIsZeroForEveryWorkerAndTheRankStays) {
  Assignment a;
  a.rank_offset = 4;
  a.world_size = 8;
  auto env = BuildWorkerEnv(a, 3, "", 0, /*virtual_local_rank=*/true);
  EXPECT_EQ(env["LOCAL_RANK"], "0");
  EXPECT_EQ(env["RANK"], "7");
  EXPECT_EQ(BuildWorkerEnv(a, 3, "", 0)["LOCAL_RANK"], "3");
}

}  // namespace
}  // namespace dlrun::launcher
