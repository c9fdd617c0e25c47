#include "launcher/detect/env_detect.h"

#include <map>

#include "absl/strings/str_cat.h"

#include "fake_env.h"
#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

struct Result {
  absl::StatusOr<Detection> d;
  LaunchOptions o;
};

// A PMIx server that must not be asked: these environments are decided by their variables.
absl::StatusOr<PmixJob> NoPmix() {
  ADD_FAILURE() << "the PMIx server was asked";
  return absl::InternalError("not expected");
}

Result Detect(std::map<std::string, std::string> vars, std::vector<std::string> args = {"p"},
              const PmixQuery& pmix = NoPmix) {
  EnvLookup env = dlrun::testing::FakeEnv(vars);
  auto o = ParseLaunchOptions(args, env);
  EXPECT_TRUE(o.ok()) << o.status();
  Result r{absl::UnknownError("unset"), *o};
  r.d = DetectEnvironment(env, r.o, pmix);
  if (r.d.ok()) r.o = r.d->options;  // the tests read the completed options
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
  EXPECT_EQ(r.o.rdzv_backend, RdzvBackend::kGrpc);
  EXPECT_EQ(r.o.rdzv_endpoint, "gpu07:29400");  // first host of the step, not of the job
  EXPECT_EQ(r.o.rdzv_id, "4242");
  EXPECT_EQ(r.d->slurm_node_id, 1);
  EXPECT_EQ(r.d->expected_hosts, (std::vector<std::string>{"gpu07", "gpu08"}));
  EXPECT_FALSE(r.o.standalone);
  // The options given stay as given: the completed ones are the detection's.
  EnvLookup env = dlrun::testing::FakeEnv({{"SLURM_JOB_ID", "4242"}, {"SLURM_PROCID", "1"},
                                           {"SLURM_NODEID", "1"}, {"SLURM_STEP_NUM_NODES", "2"},
                                           {"SLURM_NTASKS", "2"},
                                           {"SLURM_STEP_NODELIST", "gpu[07-08]"}});
  const LaunchOptions given = *ParseLaunchOptions({"p"}, env);
  ASSERT_TRUE(DetectEnvironment(env, given, NoPmix).ok());
  EXPECT_TRUE(given.rdzv_endpoint.empty());
  EXPECT_EQ(given.max_nodes, 1);
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
  EXPECT_EQ(r.o.rdzv_backend, RdzvBackend::kStatic);
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
  EXPECT_EQ(r.o.nproc_per_node.count, 4);
  EXPECT_EQ(r.o.master_addr, "job-master-0");
  EXPECT_EQ(r.o.master_port, 23456);
  EXPECT_EQ(r.o.rdzv_id, "u-1");
  r = Detect({{"PET_RDZV_ENDPOINT", "job-master-0:29400"}, {"PET_NNODES", "1:4"},
              {"PET_RDZV_ID", "el"}});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.o.rdzv_backend, RdzvBackend::kGrpc);
  EXPECT_EQ(r.o.rdzv_endpoint, "job-master-0:29400");
  EXPECT_EQ(r.o.min_nodes, 1);
  EXPECT_EQ(r.o.max_nodes, 4);
}

TEST(EnvDetect, APodWithoutItsIndexSaysWhatIsMissingNotThatAnUnsetRankIsInvalid) {
  auto r = Detect({{"PET_NNODES", "2"}});
  ASSERT_FALSE(r.d.ok());
  const std::string msg(r.d.status().message());
  EXPECT_NE(msg.find("neither PET_NODE_RANK nor RANK"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("=''"), std::string::npos) << msg;
  // The index given on the command line instead.
  r = Detect({{"PET_NNODES", "2"}}, {"--node-rank", "1", "--master-addr", "10.0.0.1", "--", "p"});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.d->source, "kubeflow");
  EXPECT_EQ(r.o.node_rank, 1);
  EXPECT_EQ(r.o.max_nodes, 2);
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
  EXPECT_EQ(r.o.rdzv_backend, RdzvBackend::kGrpc);
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

// prterun / flux-style PMIx launch: only PMIX_NAMESPACE and PMIX_RANK in the environment, the
// layout from the server.
const std::map<std::string, std::string> kPmixVars = {{"PMIX_NAMESPACE", "prterun-h1-77@1"},
                                                      {"PMIX_RANK", "1"}};

PmixJob TwoNodeJob() {
  PmixJob job;
  job.nspace = "prterun-h1-77@1";
  job.rank = 1;
  job.job_size = 2;
  job.num_nodes = 2;
  job.local_size = 1;
  job.node_list = "h1,h2";
  job.rank0_host = "h1";
  return job;
}

TEST(EnvDetect, PmixLauncherGivesNodesOrderRunIdAndTheEndpointOnRankZerosHost) {
  auto r = Detect(kPmixVars, {"p"}, [] { return TwoNodeJob(); });
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.d->source, "pmix");
  EXPECT_EQ(r.o.min_nodes, 2);
  EXPECT_EQ(r.o.max_nodes, 2);
  EXPECT_EQ(r.o.rdzv_backend, RdzvBackend::kGrpc);
  EXPECT_EQ(r.o.rdzv_endpoint, "h1:29400");
  EXPECT_EQ(r.o.rdzv_id, "prterun-h1-77@1");
  EXPECT_EQ(r.d->slurm_node_id, 1);
  EXPECT_EQ(r.d->expected_hosts, (std::vector<std::string>{"h1", "h2"}));
  EXPECT_FALSE(r.o.standalone);
  EXPECT_NE(FormatDetection(*r.d).find("PMIx PMIX_JOB_SIZE           2"), std::string::npos)
      << FormatDetection(*r.d);
}

TEST(EnvDetect, PmixNodeListStandsInForAMissingHostnameAndFlagsWin) {
  auto r = Detect(kPmixVars, {"--nnodes", "1:2", "--rdzv-id", "mine", "p"}, [] {
    PmixJob job = TwoNodeJob();
    job.rank0_host.clear();
    return job;
  });
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.o.rdzv_endpoint, "h1:29400");
  EXPECT_EQ(r.o.min_nodes, 1);
  EXPECT_EQ(r.o.rdzv_id, "mine");
}

TEST(EnvDetect, PmixOneProcessJobIsStandalone) {
  auto r = Detect(kPmixVars, {"p"}, [] {
    PmixJob job = TwoNodeJob();
    job.rank = 0;
    job.job_size = 1;
    return job;
  });
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_TRUE(r.o.standalone);
}

TEST(EnvDetect, PmixGapsAreOneLineErrorsNamingTheKey) {
  auto r = Detect(kPmixVars, {"p"}, [] {
    PmixJob job = TwoNodeJob();
    job.job_size.reset();
    return job;
  });
  ASSERT_FALSE(r.d.ok());
  EXPECT_NE(r.d.status().message().find("PMIX_JOB_SIZE"), std::string::npos) << r.d.status();
  EXPECT_NE(r.d.status().message().find("prterun-h1-77@1"), std::string::npos) << r.d.status();

  const auto hostless = [] {
    PmixJob job = TwoNodeJob();
    job.rank0_host.clear();
    job.node_list.clear();
    return job;
  };
  r = Detect(kPmixVars, {"p"}, hostless);
  ASSERT_FALSE(r.d.ok());
  EXPECT_NE(r.d.status().message().find("--rdzv-endpoint"), std::string::npos) << r.d.status();
  r = Detect(kPmixVars, {"--rdzv-endpoint", "10.0.0.1:5000", "p"}, hostless);
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  EXPECT_EQ(r.o.rdzv_endpoint, "10.0.0.1:5000");

  r = Detect(kPmixVars, {"p"}, [] { return absl::StatusOr<PmixJob>(absl::UnavailableError("PMIx_Init failed")); });
  ASSERT_FALSE(r.d.ok());
  EXPECT_EQ(r.d.status().message(), "PMIx_Init failed");
}

TEST(EnvDetect, SlurmAndOpenMpiVariablesWinOverPmix) {
  // srun --mpi=pmix and mpirun set PMIX_* too; their own variables decide, PMIx is not asked.
  std::map<std::string, std::string> vars = kPmixVars;
  vars.insert({{"SLURM_JOB_ID", "9"}, {"SLURM_PROCID", "0"}, {"SLURM_NODEID", "0"},
               {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "n[1-2]"}});
  EXPECT_EQ(Detect(vars).d->source, "slurm");
  vars = kPmixVars;
  vars.insert({{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_EQ(Detect(vars).d->source, "openmpi");
}

TEST(EnvDetect, TorchrunStyleStatic) {
  auto r = Detect({{"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "1234"}, {"NODE_RANK", "1"},
                   {"NNODES", "2"}});
  ASSERT_TRUE(r.d.ok());
  EXPECT_EQ(r.d->source, "torchrun-env");
  EXPECT_EQ(r.o.node_rank, 1);
  EXPECT_EQ(r.o.max_nodes, 2);
  EXPECT_EQ(r.o.master_addr, "10.1.1.1");
  const std::string table = FormatDetection(*r.d);
  auto bad = Detect({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "0"}, {"NODE_RANK", "0"}, {"NNODES", "2"}});
  ASSERT_FALSE(bad.d.ok());
  EXPECT_NE(std::string(bad.d.status().message()).find("MASTER_PORT='0'"), std::string::npos);
  EXPECT_NE(table.find("NODE_RANK"), std::string::npos) << table;
  EXPECT_NE(table.find("static: node rank 1, master 10.1.1.1:1234"), std::string::npos) << table;
}

TEST(EnvDetect, TheTableNamesTheMasterTheLaunchUses) {
  // `dlrun env --nnodes 2 --rdzv-backend static --rdzv-endpoint 10.1.2.3:29400 --node-rank 1`:
  // the static backend's workers meet at the endpoint, as the launch itself does.
  auto r = Detect({}, {"--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint",
                       "10.1.2.3:29400", "--node-rank", "1", "p"});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  const std::string table = FormatDetection(*r.d);
  EXPECT_NE(table.find("static: node rank 1, master 10.1.2.3:29400"), std::string::npos) << table;
  EXPECT_EQ(StaticMaster(r.o), (std::pair<std::string, int>{"10.1.2.3", 29400}));
}

// torchrun's static backend reads --rdzv-endpoint as node 0's HOST[:PORT]. Before, a port out of
// range reached the workers as MASTER_PORT=99999 and "host:abc" was resolved whole, said of
// --master-addr.
TEST(EnvDetect, TheStaticBackendsEndpointIsOneHostWithAPortInRange) {
  for (const char* good : {"10.1.2.3:29400", "node-0", "[::1]:1234", "host:0"}) {
    auto r = Detect({}, {"--nnodes", "2", "--rdzv-endpoint", good, "p"});
    ASSERT_TRUE(r.d.ok()) << r.d.status();
    EXPECT_TRUE(CheckStaticEndpoint(r.d->options).ok()) << good;
  }
  for (const char* bad : {"localhost:99999", "localhost:abc", ":29400", "a:1,b:2", "host:-1"}) {
    auto r = Detect({}, {"--nnodes", "2", "--rdzv-endpoint", bad, "p"});
    ASSERT_TRUE(r.d.ok()) << r.d.status();
    const absl::Status s = CheckStaticEndpoint(r.d->options);
    EXPECT_EQ(s.message(), absl::StrCat("invalid value '", bad,
                                        "' for --rdzv-endpoint: expected node 0's HOST[:PORT] "
                                        "with a port 0-65535 (the static rendezvous, where the "
                                        "workers' store listens; a list of endpoints needs "
                                        "--rdzv-backend c10d)"))
        << bad;
  }
  // The gRPC backend checks its list itself (ParseEndpointList); standalone has none.
  auto grpc =
      Detect({}, {"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "a:1,b:2", "p"});
  ASSERT_TRUE(grpc.d.ok()) << grpc.d.status();
  EXPECT_TRUE(CheckStaticEndpoint(grpc.d->options).ok());
}

TEST(EnvDetect, AnIpv6MasterIsWrittenWithBrackets) {
  auto r =
      Detect({}, {"--nnodes", "2", "--rdzv-endpoint", "[fe80::2]:1234", "--node-rank", "1", "p"});
  ASSERT_TRUE(r.d.ok()) << r.d.status();
  const std::string table = FormatDetection(*r.d);
  EXPECT_NE(table.find("static: node rank 1, master [fe80::2]:1234\n"), std::string::npos) << table;
}

}  // namespace
}  // namespace dlrun::launcher
