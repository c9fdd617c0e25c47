// Where dlrun finds itself when /proc/self/exe cannot be read (launcher/base/self_path.h): the
// path it was started by, resolved as execve did. The whole binary without /proc:
// DlrunCli.WithoutProcItsPrefixIsFoundFromThePathItWasStartedBy (tests/multiproc).
#include "launcher/base/self_path.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"

namespace dlrun::launcher {
namespace {

namespace fs = std::filesystem;

void MakeFile(const fs::path& p, fs::perms perms) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "#!/bin/sh\n";
  fs::permissions(p, perms);
}

TEST(SelfPath, IsThisTestsOwnExecutable) {
  EXPECT_EQ(fs::path(SelfPath()).filename(), "launcher_unit_test");
  EXPECT_TRUE(fs::path(SelfPath()).is_absolute());
}

TEST(SelfPath, APathWithASlashIsTakenFromTheWorkingDirectoryAndSymlinksResolved) {
  const fs::path root = fs::canonical(dlrun::testing::MakeTempDir("self-path"));
  MakeFile(root / "prefix/bin/dlrun", fs::perms::owner_all);
  fs::create_directories(root / "links");
  fs::create_symlink(root / "prefix/bin/dlrun", root / "links/dlrun");
  const std::string want = (root / "prefix/bin/dlrun").string();
  EXPECT_EQ(ResolveExecPath((root / "prefix/bin/dlrun").string(), "/", ""), want);
  EXPECT_EQ(ResolveExecPath("./bin/dlrun", (root / "prefix").string(), ""), want);
  EXPECT_EQ(ResolveExecPath("../prefix/bin/../bin/dlrun", (root / "links").string(), ""), want);
  EXPECT_EQ(ResolveExecPath("links/dlrun", root.string(), ""), want) << "a symlink, resolved";
  EXPECT_EQ(ResolveExecPath("./nothing/dlrun", root.string(), ""), std::nullopt);
  fs::remove_all(root);
}

TEST(SelfPath, ABareNameIsTheFirstExecutableOfThatNameInPath) {
  const fs::path root = fs::canonical(dlrun::testing::MakeTempDir("self-path"));
  MakeFile(root / "a/dlrun", fs::perms::owner_read);  // not executable: passed over
  fs::create_directories(root / "b/dlrun");           // a directory: passed over
  MakeFile(root / "c/dlrun", fs::perms::owner_all);
  MakeFile(root / "d/dlrun", fs::perms::owner_all);
  const std::string path = (root / "none").string() + ":" + (root / "a").string() + ":" +
                           (root / "b").string() + ":c:" + (root / "d").string();
  EXPECT_EQ(ResolveExecPath("dlrun", root.string(), path), (root / "c/dlrun").string())
      << "a relative PATH entry is taken from the working directory";
  EXPECT_EQ(ResolveExecPath("dlrun", root.string(), (root / "d").string()),
            (root / "d/dlrun").string());
  EXPECT_EQ(ResolveExecPath("dlrun", (root / "c").string(), ":"), (root / "c/dlrun").string())
      << "an empty PATH entry is the working directory";
  EXPECT_EQ(ResolveExecPath("dlrun", root.string(), (root / "a").string()), std::nullopt);
  EXPECT_EQ(ResolveExecPath("", root.string(), (root / "d").string()), std::nullopt);
  fs::remove_all(root);
}

}  // namespace
}  // namespace dlrun::launcher
