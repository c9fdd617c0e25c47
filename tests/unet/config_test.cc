// The U-Net trainer's YAML config loader (examples/unet/config.h): merges, and hostile files
// that must give one-line errors rather than a crash or a hang.
#include "unet/config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::examples {
namespace {

TEST(UnetConfig, TheShippedFileMergesBaseIntoShort) {
  auto cfg = LoadConfig(std::string(SOURCE_DIR) + "/examples/unet/config/UNet.yaml", "short");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->at("num_epochs"), "4");                // its own key
  EXPECT_EQ(cfg->at("data_size"), "64");                // from base
  EXPECT_EQ(cfg->at("lr_schedule.start_lr"), "1.0e-3");  // nested, from base
  EXPECT_EQ(cfg->at("train_path"), "");
}

// The tutorial's large-batch configurations: half the baseline's 10240 iterations each
// (Nsamples x num_epochs / global_batch_size), sqrt LR scaling with warm-up; prefetch 4.
TEST(UnetConfig, TheOptConfigurationsRunHalfTheBaselinesIterations) {
  const std::string file = std::string(SOURCE_DIR) + "/examples/unet/config/UNet.yaml";
  auto iterations = [&](const char* name) -> int64_t {
    auto cfg = LoadConfig(file, name);
    EXPECT_TRUE(cfg.ok()) << name << ": " << cfg.status();
    if (!cfg.ok()) return int64_t{0};
    return std::stoll(cfg->at("Nsamples")) * std::stoll(cfg->at("num_epochs")) /
           std::stoll(cfg->at("global_batch_size"));
  };
  EXPECT_EQ(iterations("base"), 10240);
  for (const char* name : {"bs256_opt", "bs512_opt", "bs2048_opt"}) {
    EXPECT_EQ(iterations(name), 5120) << name;
    auto cfg = LoadConfig(file, name);
    ASSERT_TRUE(cfg.ok());
    EXPECT_EQ(cfg->at("lr_schedule.scaling"), "sqrt") << name;
    EXPECT_EQ(cfg->at("prefetch_factor"), "4") << name;
  }
}

TEST(UnetConfig, AListOfMergesLetsEarlierMapsWinAndOwnKeysWinOverAll) {
  auto cfg = ParseConfig(
      "a: &a {x: 1, y: 1}\nb: &b {x: 2, y: 2, z: 2}\nc:\n  <<: [*a, *b]\n  y: 3\n", "c", "t.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->at("x"), "1");
  EXPECT_EQ(cfg->at("y"), "3");
  EXPECT_EQ(cfg->at("z"), "2");
}

TEST(UnetConfig, AnUnknownConfigurationListsTheKnownOnes) {
  auto cfg = ParseConfig("one: {a: 1}\ntwo: {a: 2}\n", "three", "t.yaml");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().message(), "no configuration 'three' in t.yaml: expected one of one, two");
}

TEST(UnetConfig, HostileFilesGiveOneLineErrors) {
  struct Case {
    const char* yaml;
    const char* expected;
  } cases[] = {
      {"c: &c\n  <<: *c\n", "nests deeper than 32 levels"},   // a merge of itself
      {"c: &c\n  x: *c\n", "nests deeper than 32 levels"},    // a value that is itself
      {"c:\n  <<: 3\n", "merge key '<<' of the configuration: expected a map or a list of maps"},
      {"c:\n  <<: [3]\n", "expected a map or a list of maps"},
      {"c:\n  ? [a, b]\n  : 1\n", "a key of the configuration is not a scalar"},
      {"c: {a: [1, 2\n", "t.yaml is not valid YAML"},
      {"c: 3\n", "no configuration 'c' in t.yaml"},
      {"- c\n", "no configuration 'c' in t.yaml: expected one of (none)"},
      {"", "no configuration 'c'"},
  };
  for (const Case& c : cases) {
    auto cfg = ParseConfig(c.yaml, "c", "t.yaml");
    ASSERT_FALSE(cfg.ok()) << c.yaml;
    const std::string msg(cfg.status().message());
    EXPECT_TRUE(absl::StrContains(msg, c.expected)) << c.yaml << " gave: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(UnetConfig, AMissingFileIsNotFound) {
  auto cfg = LoadConfig("/nonexistent/UNet.yaml", "short");
  ASSERT_FALSE(cfg.ok());
  EXPECT_TRUE(lite::IsNotFound(cfg.status())) << cfg.status().ToString();
  EXPECT_EQ(cfg.status().message(), "config file '/nonexistent/UNet.yaml' (--yaml-config) not found");
  cfg = LoadConfig("/", "short");  // a directory
  ASSERT_FALSE(cfg.ok());
  EXPECT_TRUE(lite::IsNotFound(cfg.status())) << cfg.status().ToString();
}

// `--config NAME` from any directory: the copy next to the program's bin/ directory.
TEST(UnetConfig, TheDefaultFileIsFoundNextToTheProgram) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("dlrun-config-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "bin");
  EXPECT_EQ(DefaultConfigFile((dir / "bin" / "train_unet").string()),
            "examples/unet/config/UNet.yaml");
  std::filesystem::create_directories(dir / "share" / "dlrun" / "unet");
  { std::ofstream(dir / "share" / "dlrun" / "unet" / "UNet.yaml") << "short: {}\n"; }
  EXPECT_EQ(DefaultConfigFile((dir / "bin" / "train_unet").string()),
            (dir / "share" / "dlrun" / "unet" / "UNet.yaml").string());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlrun::examples
