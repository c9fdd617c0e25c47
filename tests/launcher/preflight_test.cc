// The preflight's checks (on the fake NVML), the bad-node list, and how `dlrun slurm` and
// `dlrun runai` keep jobs off the nodes in it.
#include "launcher/base/preflight.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "common/contract.h"
#include "gtest/gtest.h"
#include "launcher/base/bad_nodes.h"
#include "launcher/cli/node_cli.h"
#include "launcher/cli/options.h"
#include "launcher/jobgen/job_script.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::launcher {
namespace {

// Whether `text` holds `part` (the test binary has no gmock).
::testing::AssertionResult Has(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not hold '" << part << "'";
}

class FakeNvml {  // the fake NVML for one test (tests/compat/fake_nvml.c)
 public:
  FakeNvml(const char* gpus, const char* ecc, const char* remap) {
    setenv(contract::kNvmlLibrary, FAKE_NVML_LIB, 1);
    setenv("FAKE_NVML_GPUS", gpus, 1);
    setenv("FAKE_NVML_ECC", ecc, 1);
    setenv("FAKE_NVML_REMAP_PENDING", remap, 1);
  }
  ~FakeNvml() {
    for (const char* v : {contract::kNvmlLibrary, "FAKE_NVML_GPUS", "FAKE_NVML_ECC",
                          "FAKE_NVML_REMAP_PENDING"}) {
      unsetenv(v);
    }
  }
};

TEST(Preflight, ModesAndTheirErrors) {
  EXPECT_EQ(*ParsePreflightMode("quick"), PreflightMode::kQuick);
  EXPECT_EQ(*ParsePreflightMode("full"), PreflightMode::kFull);
  EXPECT_EQ(*ParsePreflightMode("off"), PreflightMode::kOff);
  EXPECT_EQ(ParsePreflightMode("fast").status().message(),
            "--preflight 'fast': expected off, quick or full");
  auto launch = ParseLaunchOptions({"--preflight", "slow", "train.py"}, [](std::string_view) {
    return std::optional<std::string>();
  });
  ASSERT_FALSE(launch.ok());
  EXPECT_TRUE(Has(std::string(launch.status().message()), "'slow'"));
  EXPECT_FALSE(ParsePreflightArgs({"--preflight", "off"}).ok());
  auto a = ParsePreflightArgs({"--preflight", "full", "--gpus", "2", "--checkpoint-dir", "/c"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->mode, PreflightMode::kFull);
  EXPECT_EQ(a->gpus, 2);
}

TEST(Preflight, HealthyNodePassesWithItsFigures) {
  FakeNvml nvml("1000:80000:0,1000:80000:0", "", "");
  auto loaded = Nvml::Load();
  ASSERT_NE(loaded, nullptr);
  const PreflightReport r =
      RunPreflight({PreflightMode::kQuick, 2, ::testing::TempDir() + "/not/made/yet"}, loaded.get());
  EXPECT_EQ(r.Failures(), "");
  EXPECT_GT(r.gflops, 0);
  ASSERT_EQ(r.checks.size(), 3u);
  EXPECT_EQ(r.checks[0].detail, "NVML sees 2 GPU(s)");
  EXPECT_EQ(r.checks[1].name, "disk");  // the nearest directory that exists
  EXPECT_TRUE(Has(r.checks[1].detail, " free in "));
  EXPECT_TRUE(Has(r.checks[2].detail, "GFLOP/s on one core"));
}

TEST(Preflight, EccErrorsRowRemapsAndMissingGpusFailTheNode) {
  FakeNvml nvml("1000:80000:0,1000:80000:0", "1:3", "0");
  auto loaded = Nvml::Load();
  ASSERT_NE(loaded, nullptr);
  PreflightReport r = RunPreflight({PreflightMode::kQuick, 2, ""}, loaded.get());
  EXPECT_EQ(r.Failures(),
            "gpu 0: a row remap pending a reset; gpu 1: 3 uncorrected ECC errors since the driver "
            "loaded");
  r = RunPreflight({PreflightMode::kQuick, 4, ""}, loaded.get());
  EXPECT_EQ(r.Failures(), "gpus: NVML sees 2 GPU(s); the job needs 4");
  r = RunPreflight({PreflightMode::kQuick, 1, ""}, nullptr);
  EXPECT_EQ(r.Failures(), "gpus: NVML cannot be loaded, so no GPU is seen; the job needs 1");
  EXPECT_TRUE(RunPreflight({PreflightMode::kOff, 4, ""}, nullptr).checks.empty());
}

TEST(Preflight, CheckpointDirectoryFromTheProgramsFlags) {
  EXPECT_EQ(CheckpointDirOf({"train.py", "--checkpoint-dir", "/ck"}, "."), "/ck");
  EXPECT_EQ(CheckpointDirOf({"train.py", "--save_dir=/s"}, "."), "/s");
  EXPECT_EQ(CheckpointDirOf({"train.py", "--output-dir"}, "/logs"), "/logs");
  EXPECT_EQ(CheckpointDirOf({"train.py"}, "/logs"), "/logs");
}

TEST(BadNodes, AddedUpdatedListedAndCleared) {
  MemoryFileSystem fs;
  const std::string path = "/home/u/.cache/dlrun/bad_nodes.tsv";
  EXPECT_TRUE(ReadBadNodes(fs, path).empty());
  ASSERT_TRUE(AddBadNode(fs, path, {"n1", 100, "preflight: compute 0.5 GFLOP/s"}).ok());
  ASSERT_TRUE(AddBadNode(fs, path, {"n2", 200, "two\tcuda\nerrors"}).ok());
  ASSERT_TRUE(AddBadNode(fs, path, {"n1", 300, "again"}).ok());
  auto nodes = ReadBadNodes(fs, path);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].host, "n1");
  EXPECT_EQ(nodes[0].since, 300);
  EXPECT_EQ(nodes[0].reason, "again");
  EXPECT_EQ(nodes[1].reason, "two cuda errors");  // one line per node, whatever the reason
  EXPECT_EQ(BadNodeHosts(nodes), "n1,n2");
  EXPECT_EQ(*ClearBadNodes(fs, path, {"n2", "n9"}), 1);
  EXPECT_EQ(BadNodeHosts(ReadBadNodes(fs, path)), "n1");
  EXPECT_EQ(*ClearBadNodes(fs, path, {}), 1);
  EXPECT_TRUE(ReadBadNodes(fs, path).empty());
}

TEST(BadNodes, PathFollowsXdgCacheHomeThenHome) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg ? xdg : "";
  setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(BadNodesPath(), "/x/cache/dlrun/bad_nodes.tsv");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(BadNodesPath(), std::string(std::getenv("HOME")) + "/.cache/dlrun/bad_nodes.tsv");
  if (xdg) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

TEST(BadNodes, CommandLineRefusesWhatItCannotDo) {
  EXPECT_EQ(ParseBadNodesArgs({"n1"}).status().message(),
            "dlrun bad-nodes: unexpected argument 'n1' (hosts follow --clear)");
  EXPECT_EQ(ParseBadNodesArgs({"--add", "n1"}).status().message(),
            "dlrun bad-nodes: --add n1 without --reason (say why it is bad)");
  auto a = ParseBadNodesArgs({"--clear", "n1", "n2"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->command, (std::vector<std::string>{"n1", "n2"}));
}

TEST(BadNodes, SlurmScriptExcludesThemAndRunaiPodsKeepOff) {
  auto s = ParseSlurmArgs({"--nodes", "2", "--exclude", "n0", "--", "train.py"});
  ASSERT_TRUE(s.ok()) << s.status();
  s->exclude += ",n7";
  s->bad_nodes = 1;
  EXPECT_TRUE(Has(RenderSlurmScript(*s, "{{SBATCH_LINES}}"),
                  "#SBATCH --exclude=n0,n7                 # 1 found bad before (dlrun bad-nodes)"));

  auto r = ParseRunaiArgs({"--name", "unet", "-i", "img", "--", "train.py"});
  ASSERT_TRUE(r.ok()) << r.status();
  r->avoid_nodes = {"n7", "n8"};
  const YAML::Node job = YAML::LoadAll(RenderRunaiManifest(*r))[1];
  const YAML::Node expr = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
                             ["affinity"]["nodeAffinity"]
                             ["requiredDuringSchedulingIgnoredDuringExecution"]
                             ["nodeSelectorTerms"][0]["matchExpressions"][0];
  EXPECT_EQ(expr["key"].as<std::string>(), "kubernetes.io/hostname");
  EXPECT_EQ(expr["operator"].as<std::string>(), "NotIn");
  EXPECT_EQ(expr["values"].as<std::vector<std::string>>(), (std::vector<std::string>{"n7", "n8"}));
}

}  // namespace
}  // namespace dlrun::launcher
