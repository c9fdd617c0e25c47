#include "launcher/env_detect.h"

#include <map>

#include "gtest/gtest.h"
#include "launcher/gpu_pick.h"
#include "launcher/rdzv_source.h"

namespace dlrun::launcher {
namespace {

struct Result {
  absl::StatusOr<Detection> d;
  LaunchOptions o;
};

Result Detect(std::map<std::string, std::string> vars, std::vector<std::string> args = {"p"}) {
  EnvLookup env = [vars](std::string_view n) -> std::optional<std::string> {
    auto it = vars.find(std::string(n));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  auto o = ParseLaunchOptions(args, env);
  EXPECT_TRUE(o.ok()) << o.status();
  Result r{absl::UnknownError("unset"), *o};
  r.d = DetectEnvironment(env, &r.o);
  return r;
}

TEST(EnvDetect, NothingMeansStandalone) {
  auto r = Detect({});
  ASSERT_TRUE(r.d.ok());
  EXPECT_EQ(r.d->source, "standalone");
  EXPECT_TRUE(r.o.standalone);
}

TEST(EnvDetect, SlurmMultiNodeStep) {
  auto r = Detect({{"SLURM_JOB_ID", "4242"}, {"SLURM_PROCID", "1"}, {"SLURM_NODEID", "1"},
                   {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NTASKS", "2"},
                   {"SLURM_STEP_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_NODELIST", "gpu[01-09]"}});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.d->source, "slurm");
  EXPECT_EQ(r.o.min_nodes, 2);
  EXPECT_EQ(r.o.max_nodes, 2);
  EXPECT_EQ(r.o.rdzv_backend, "grpc");
  EXPECT_EQ(r.o.rdzv_endpoint, "gpu07:29400");  // first host of the step, not of the job
  EXPECT_EQ(r.o.rdzv_id, "4242");
  EXPECT_EQ(r.d->slurm_node_id, 1);
  EXPECT_EQ(r.d->expected_hosts, (std::vector<std::string>{"gpu07", "gpu08"}));
  EXPECT_FALSE(r.o.standalone);
}

TEST(EnvDetect, SlurmOneNodeIsStandaloneAndFlagsWin) {
  auto r = Detect({{"SLURM_JOB_ID", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NODEID", "0"},
                   {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_STEP_NODELIST", "n1"}});
  ASSERT_TRUE(r.d.ok());
  EXPECT_TRUE(r.o.standalone);
  r = Detect({{"SLURM_JOB_ID", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NODEID", "0"},
              {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "n[1-2]"}},
             {"--rdzv-endpoint", "other:1234", "--rdzv-id", "mine", "p"});
  ASSERT_TRUE(r.d.ok());
  EXPECT_EQ(r.o.rdzv_endpoint, "other:1234");
  EXPECT_EQ(r.o.rdzv_id, "mine");
}

TEST(EnvDetect, SlurmBadValuesAreErrors) {
  auto r = Detect({{"SLURM_JOB_ID", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NODEID", "x"},
                   {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "n[1-2]"}});
  ASSERT_FALSE(r.d.ok());
  EXPECT_NE(std::string(r.d.status().message()).find("SLURM_NODEID='x'"), std::string::npos);
  r = Detect({{"SLURM_JOB_ID", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NODEID", "0"},
              {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "n[1-"}});
  ASSERT_FALSE(r.d.ok());
  EXPECT_NE(std::string(r.d.status().message()).find("invalid hostlist"), std::string::npos);
}

TEST(EnvDetect, OpenMpi) {
  auto r = Detect({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_PORT", "29999"}});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.d->source, "openmpi");
  EXPECT_EQ(r.o.node_rank, 1);
  EXPECT_EQ(r.o.max_nodes, 2);
  EXPECT_EQ(r.o.rdzv_backend, "static");
  EXPECT_EQ(r.o.master_addr, "127.0.0.1");
  EXPECT_EQ(r.o.master_port, 29999);
  r = Detect({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
              {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  ASSERT_FALSE(r.d.ok());  // across nodes without MASTER_ADDR
  EXPECT_NE(std::string(r.d.status().message()).find("MASTER_ADDR"), std::string::npos);
}

TEST(EnvDetect, KubeflowPodIndexIsTheNodeRank) {
  auto r = Detect({{"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}, {"RANK", "2"},
                   {"WORLD_SIZE", "3"}, {"PET_NPROC_PER_NODE", "4"}, {"PET_NODE_RANK", "2"},
                   {"PET_NNODES", "3"}, {"JOB_UUID", "u-1"}});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.d->source, "kubeflow");
  EXPECT_EQ(r.o.node_rank, 2);
  EXPECT_EQ(r.o.max_nodes, 3);
  EXPECT_EQ(r.o.nproc_per_node, "4");
  EXPECT_EQ(r.o.master_addr, "job-master-0");
  EXPECT_EQ(r.o.master_port, 23456);
  EXPECT_EQ(r.o.rdzv_id, "u-1");
  r = Detect({{"PET_RDZV_ENDPOINT", "job-master-0:29400"}, {"PET_NNODES", "1:4"},
              {"PET_RDZV_ID", "el"}});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.o.rdzv_backend, "grpc");
  EXPECT_EQ(r.o.rdzv_endpoint, "job-master-0:29400");
  EXPECT_EQ(r.o.min_nodes, 1);
  EXPECT_EQ(r.o.max_nodes, 4);
}

TEST(EnvDetect, RunaiPodsJoinTheMasterPodsRendezvous) {
  // What `dlrun runai` makes every pod run: --rdzv-backend grpc, the endpoint from MASTER_ADDR.
  std::map<std::string, std::string> pod = {{"MASTER_ADDR", "train-master-0"},
                                            {"MASTER_PORT", "23456"}, {"RANK", "1"},
                                            {"WORLD_SIZE", "2"}, {"POD_INDEX", "1"},
                                            {"JOB_UUID", "u-7"}, {"DLRUN_RDZV_PORT", "29455"}};
  auto r = Detect(pod, {"--nnodes", "2", "--rdzv-backend", "grpc", "--", "p"});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.d->source, "kubeflow");
  EXPECT_EQ(r.o.rdzv_backend, "grpc");
  EXPECT_EQ(r.o.rdzv_endpoint, "train-master-0:29455");
  EXPECT_EQ(r.o.rdzv_id, "u-7");
  EXPECT_EQ(r.d->slurm_node_id, 1);  // the pod index orders the agents
  pod["DLRUN_RDZV_PORT"] = "99999";
  r = Detect(pod, {"--rdzv-backend", "grpc", "p"});
  ASSERT_FALSE(r.d.ok());
  EXPECT_NE(std::string(r.d.status().message()).find("DLRUN_RDZV_PORT='99999'"), std::string::npos);
  r = Detect({{"PET_NODE_RANK", "0"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}},
             {"--rdzv-backend", "grpc", "p"});
  ASSERT_FALSE(r.d.ok());
  EXPECT_NE(std::string(r.d.status().message()).find("MASTER_ADDR is unset"), std::string::npos);
}

TEST(EnvDetect, TorchrunStyleStatic) {
  auto r = Detect({{"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "1234"}, {"NODE_RANK", "1"},
                   {"NNODES", "2"}});
  ASSERT_TRUE(r.d.ok());
  EXPECT_EQ(r.d->source, "torchrun-env");
  EXPECT_EQ(r.o.node_rank, 1);
  EXPECT_EQ(r.o.max_nodes, 2);
  EXPECT_EQ(r.o.master_addr, "10.1.1.1");
  const std::string table = FormatDetection(*r.d, r.o);
  auto bad = Detect({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "0"}, {"NODE_RANK", "0"}, {"NNODES", "2"}});
  ASSERT_FALSE(bad.d.ok());
  EXPECT_NE(std::string(bad.d.status().message()).find("MASTER_PORT='0'"), std::string::npos);
  EXPECT_NE(table.find("NODE_RANK"), std::string::npos) << table;
  EXPECT_NE(table.find("static: node rank 1, master 10.1.1.1:1234"), std::string::npos) << table;
}

TEST(RdzvConf, KeysAndErrors) {
  RdzvSourceOptions o;
  ASSERT_TRUE(ApplyRdzvConf("join_timeout=10,last_call_timeout=2.5,heartbeat_interval=0.5,"
                            "heartbeat_misses=4,is_host=false,read_timeout=60",
                            &o)
                  .ok());
  EXPECT_EQ(o.join_timeout.count(), 10000);
  EXPECT_EQ(o.last_call.count(), 2500);
  EXPECT_EQ(o.heartbeat_interval.count(), 500);
  EXPECT_EQ(o.heartbeat_misses, 4);
  EXPECT_EQ(o.is_host, "false");
  auto s = ApplyRdzvConf("join_timeout=-1", &o);
  EXPECT_NE(std::string(s.message()).find("join_timeout"), std::string::npos);
  s = ApplyRdzvConf("bogus=1", &o);
  EXPECT_NE(std::string(s.message()).find("unknown key 'bogus'"), std::string::npos);
  EXPECT_FALSE(ApplyRdzvConf("novalue", &o).ok());
}

TEST(GpuPick, LeastLoadedByMemoryAndUtilisation) {
  std::vector<GpuLoad> g = {{0, 30, 100, 50},   // 30% memory + 50% busy = 80
                            {1, 0, 100, 0},     // idle
                            {2, 90, 100, 90},   // 180
                            {3, 10, 100, 5}};   // 15
  EXPECT_EQ(PickLeastLoaded(g, 2), (std::vector<int>{1, 3}));
  EXPECT_EQ(PickLeastLoaded(g, 3), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(PickLeastLoaded(g, 9).size(), 4u);
  // No driver on this machine: NVML cannot load and dlrun carries on without it.
  if (!QueryGpuLoads().has_value()) SUCCEED();
}

TEST(StdSpec, PerRankValuesAndFilter) {
  EXPECT_EQ(StdSpecPerRank("3", 2), (std::vector<int>{3, 3}));
  EXPECT_EQ(StdSpecPerRank("0:1,2:3", 3), (std::vector<int>{1, 0, 3}));
  EXPECT_EQ(*ParseRankList("0,2", 3), (std::vector<int>{0, 2}));
  EXPECT_FALSE(ParseRankList("5", 3).ok());
}

}  // namespace
}  // namespace dlrun::launcher
