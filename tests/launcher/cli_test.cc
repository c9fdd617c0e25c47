#include "launcher/cli/options.h"
#include "launcher/app/plan.h"  // ResolveNprocPerNode, CheckLocalRanks

#include <map>

#include "fake_env.h"
#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

using dlrun::testing::FakeEnv;

absl::StatusOr<LaunchOptions> Parse(std::vector<std::string> args,
                                    std::map<std::string, std::string> env = {}) {
  return ParseLaunchOptions(args, FakeEnv(std::move(env)));
}

TEST(LaunchOptions, BothSpellingsAndEqualsForm) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--nproc-per-node", "4", "train", "--lr", "1"},
        std::vector<std::string>{"--nproc_per_node=4", "train", "--lr", "1"},
        std::vector<std::string>{"--nproc_per_node", "4", "--", "train", "--lr", "1"}}) {
    auto o = Parse(args);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->nproc_per_node.count, 4);
    EXPECT_EQ(o->command, (std::vector<std::string>{"train", "--lr", "1"}));
  }
}

// As argparse (so torchrun): an unambiguous prefix of a long flag is the flag; an ambiguous one
// names the candidates; a misspelt one gets the nearest flag suggested.
TEST(LaunchOptions, PrefixesOfLongFlagsAndSuggestions) {
  auto o = Parse({"--nproc_per", "2", "--max-re=3", "p"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc_per_node.count, 2);
  EXPECT_EQ(o->max_restarts, 3);
  auto r = Parse({"--rdzv", "x", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("ambiguous flag '--rdzv' for dlrun: it could be "),
            std::string::npos) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("--rdzv-endpoint"), std::string::npos);
  r = Parse({"--nprocs-per-node", "2", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("did you mean --nproc-per-node?"),
            std::string::npos) << r.status();
  r = Parse({"--frobnicate", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(std::string(r.status().message()).find("did you mean"), std::string::npos)
      << r.status();
}

TEST(LaunchOptions, ProgramArgumentsAreNotParsed) {
  auto o = Parse({"--standalone", "prog", "--nproc-per-node", "9", "--bogus"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->standalone);
  EXPECT_EQ(o->nproc_per_node.count, 1);
  EXPECT_EQ(o->command.size(), 4u);
}

TEST(LaunchOptions, Nnodes) {
  auto o = Parse({"--nnodes", "2:4", "p"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->min_nodes, 2);
  EXPECT_EQ(o->max_nodes, 4);
  o = Parse({"--nnodes=3", "p"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->min_nodes, 3);
  EXPECT_EQ(o->max_nodes, 3);
  for (const char* bad : {"0", "4:2", "x", "1:2:3", ""}) {
    auto r = Parse({"--nnodes", bad, "p"});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(std::string(r.status().message()).find("--nnodes"), std::string::npos);
  }
}

TEST(LaunchOptions, BadValuesNameTheFlagAndTheAcceptedValues) {
  auto r = Parse({"--nproc-per-node", "many", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(std::string(r.status().message()),
            "invalid value 'many' for --nproc-per-node: expected auto, gpu, cpu or an integer "
            "1-4096");
  r = Parse({"--max-restarts=-1", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("--max-restarts"), std::string::npos);
  r = Parse({"--master-port", "70000", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("0-65535"), std::string::npos);
  r = Parse({"--redirects", "7", "p"});
  ASSERT_FALSE(r.ok());
  r = Parse({"--frobnicate", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("unknown flag '--frobnicate'"),
            std::string::npos);
  r = Parse({"--standalone"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("missing the program"), std::string::npos);
  r = Parse({"--nproc-per-node"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("needs a value"), std::string::npos);
  r = Parse({"--nnodes", "2", "--node-rank", "2", "p"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("--node-rank"), std::string::npos);
}

TEST(LaunchOptions, TelemetryFlags) {
  auto o = Parse({"p"});
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->telemetry);
  EXPECT_EQ(o->telemetry_flags.metrics_port, -1) << "HTTP is off unless asked";
  EXPECT_EQ(o->telemetry_flags.straggler_factor, 1.2);
  EXPECT_EQ(o->telemetry_flags.straggler_windows, 3);
  o = Parse({"--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--straggler-factor", "1.5",
             "--straggler-windows=5", "--telemetry", "off", "p"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->telemetry);
  EXPECT_EQ(o->telemetry_flags.metrics_port, 0);
  EXPECT_EQ(o->telemetry_flags.metrics_addr, "127.0.0.1");
  EXPECT_EQ(o->telemetry_flags.straggler_factor, 1.5);
  EXPECT_EQ(o->telemetry_flags.straggler_windows, 5);
  EXPECT_EQ(Parse({"--straggler-factor", "0.9", "p"}).status().message(),
            "invalid value '0.9' for --straggler-factor: expected a number from 1.01 to 100");
  EXPECT_EQ(Parse({"--straggler-factor", "nan", "p"}).status().message(),
            "invalid value 'nan' for --straggler-factor: expected a number from 1.01 to 100");
  EXPECT_EQ(Parse({"--telemetry", "maybe", "p"}).status().message(),
            "invalid value 'maybe' for --telemetry: expected on or off");
  EXPECT_EQ(Parse({"--metrics-port", "65536", "p"}).status().message(),
            "invalid value '65536' for --metrics-port: expected an integer from 0 to 65535");
}

TEST(LaunchOptions, ShortFlags) {
  auto o = Parse({"-r", "3", "-t1", "-m", "pkg.mod"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->redirects.all, 3);
  EXPECT_EQ(o->tee.all, 1);
  EXPECT_TRUE(o->module);
  EXPECT_EQ(o->command, std::vector<std::string>{"pkg.mod"});
}

// A newcomer's `--standalone --nnodes 2` used to run one node without a word.
TEST(LaunchOptions, StandaloneRefusesANodeCountItCannotReach) {
  auto o = Parse({"--standalone", "--nnodes", "2", "p"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "invalid value '2' for --nnodes: expected 1 (or 1:N) with --standalone, which runs one "
            "node on loopback; for 2 nodes drop --standalone and give --rdzv-endpoint HOST:PORT");
  EXPECT_FALSE(Parse({"--standalone", "--nnodes", "2:4", "p"}).ok());
  o = Parse({"--standalone", "--nnodes", "1:2", "p"});  // one node is within the range
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_nodes, 1);
}

TEST(LaunchOptions, PetEnvironmentFallbackAndPrecedence) {
  auto o = Parse({"p"}, {{"PET_NPROC_PER_NODE", "3"}, {"PET_NNODES", "1:2"},
                         {"PET_MAX_RESTARTS", "5"}, {"PET_STANDALONE", "1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nproc_per_node.count, 3);
  EXPECT_EQ(o->max_restarts, 5);
  EXPECT_TRUE(o->standalone);
  o = Parse({"--nproc-per-node", "2", "p"}, {{"PET_NPROC_PER_NODE", "3"}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->nproc_per_node.count, 2);  // the command line wins
  auto r = Parse({"p"}, {{"PET_MAX_RESTARTS", "lots"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("PET_MAX_RESTARTS"), std::string::npos);
}

TEST(LaunchOptions, ResolveNprocPerNode) {
  auto resolve = [](const std::string& v, int gpus, int cpus) {
    auto spec = ParseNprocPerNode(v);
    return spec.ok() ? ResolveNprocPerNode(*spec, gpus, cpus) : spec.status();
  };
  EXPECT_EQ(*resolve("auto", 0, 8), 8);
  EXPECT_EQ(*resolve("auto", 4, 8), 4);
  EXPECT_EQ(*resolve("cpu", 4, 8), 8);
  EXPECT_EQ(*resolve("gpu", 2, 8), 2);
  EXPECT_FALSE(resolve("gpu", 0, 8).ok());
  EXPECT_FALSE(resolve("xpu", 0, 8).ok());
  EXPECT_EQ(*resolve("3", 0, 1), 3);
  EXPECT_EQ(std::string(resolve("0", 0, 1).status().message()),
            "invalid value '0' for --nproc-per-node: expected auto, gpu, cpu or an integer 1-4096");
  EXPECT_EQ(ParseNprocPerNode("auto")->text, "auto");
}

TEST(StdSpec, PerRankValuesAndFilter) {
  EXPECT_EQ(Parse({"-r", "3", "p"})->redirects.PerRank(2), (std::vector<int>{3, 3}));
  EXPECT_EQ(Parse({"-r", "0:1,2:3", "p"})->redirects.PerRank(3), (std::vector<int>{1, 0, 3}));
  EXPECT_FALSE(Parse({"-t", "0:0", "p"})->tee.Any()) << "every rank 0: nothing to a file";
  auto f = Parse({"--local-ranks-filter", "0,2", "p"});
  EXPECT_EQ(f->local_ranks_filter, (std::vector<int>{0, 2}));
  EXPECT_TRUE(CheckLocalRanks(*f, 3).ok());
  EXPECT_EQ(std::string(CheckLocalRanks(*Parse({"--local-ranks-filter", "5", "p"}), 3).message()),
            "invalid value '5' for --local-ranks-filter: expected comma-separated local ranks in "
            "[0, 3)");
  EXPECT_FALSE(Parse({"--local-ranks-filter", "x", "p"}).ok());
}

TEST(LaunchOptions, EveryTorchrunFlagIsAccepted) {
  // PyTorch 2.x's torchrun flags (torch/distributed/run.py), in its own spellings.
  auto o = Parse({"--nnodes=1",           "--nproc_per_node=2",  "--rdzv_backend=static",
                  "--rdzv_endpoint=h:1",  "--rdzv_id=x",         "--rdzv_conf=timeout=5",
                  "--max_restarts=1",     "--monitor_interval=5", "--start_method=fork",
                  "--role=r",             "--log_dir=/tmp/l",    "-r", "3", "-t", "0:1",
                  "--local_ranks_filter=0", "--node_rank=0",     "--master_addr=a",
                  "--master_port=1",      "--local_addr=b",      "--logs_specs=default",
                  "--numa_binding=node",  "--event_log_handler=null",
                  "--signals_to_handle=SIGTERM", "--run_path", "--no_python", "prog"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->start_method, "fork");
  EXPECT_EQ(o->cpu_affinity, CpuAffinity::kNode);
  EXPECT_EQ(o->tee.by_rank, (std::map<int, int>{{0, 1}}));
  for (const char* m : {"--standalone", "-m"}) EXPECT_TRUE(Parse({m, "prog"}).ok()) << m;
  EXPECT_NE(std::string(Parse({"--start-method", "thread", "p"}).status().message())
                .find("expected spawn, fork or forkserver"),
            std::string::npos);
}

TEST(LaunchOptions, EtcdBackendsSayWhatToUseInstead) {
  for (const char* b : {"etcd", "etcd-v2"}) {
    const std::string m(Parse({"--rdzv-backend", b, "p"}).status().message());
    EXPECT_NE(m.find("not supported"), std::string::npos) << m;
    EXPECT_NE(m.find("--rdzv-backend c10d"), std::string::npos) << m;
  }
}

TEST(LaunchOptions, GpuAndCpuDefaultsFollowTorchrun) {
  auto o = Parse({"prog"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->gpus.mode, GpuSpec::Mode::kInherit);
  EXPECT_EQ(o->cpu_affinity, CpuAffinity::kNone);
  EXPECT_FALSE(o->worker_exit_code);
  EXPECT_FALSE(Parse({"--gpus", "some", "p"}).ok());
  EXPECT_FALSE(Parse({"--cpu-affinity", "all", "p"}).ok());
  EXPECT_EQ(Parse({"--numa-binding", "exclusive", "p"})->cpu_affinity, CpuAffinity::kBlock);
}

TEST(LaunchOptions, HelpListsTheValuesOfRedirectsAndTee) {
  const std::string help = UsageText();
  for (const char* flag : {"--redirects", "--tee"}) {
    const size_t at = help.find(flag);
    ASSERT_NE(at, std::string::npos) << help;
    const std::string entry = help.substr(at, help.find("\n  -", at + 1) - at);
    EXPECT_NE(entry.find("0 none, 1 stdout, 2 stderr, 3 both"), std::string::npos) << entry;
  }
}

}  // namespace
}  // namespace dlrun::launcher
