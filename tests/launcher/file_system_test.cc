// The agent's file system seam (launcher/base/file_system.h): the in-memory one the agent tests
// run on must behave as the real one does, so both run the same script here.
#include "launcher/base/file_system.h"

#include <sys/stat.h>

#include <filesystem>
#include <memory>

#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"

namespace dlrun::launcher {
namespace {

void Script(FileSystem& fs, const std::string& root) {
  EXPECT_TRUE(absl::IsNotFound(fs.Read(root + "/a/b/error.json").status()));
  ASSERT_TRUE(fs.Write(root + "/a/b/error.json", "{}").ok()) << "parents are made";
  ASSERT_TRUE(fs.Write(root + "/a/top.txt", "top").ok());
  ASSERT_TRUE(fs.Write(root + "/a/top.txt", "again").ok()) << "replaced";
  EXPECT_EQ(fs.Read(root + "/a/top.txt").value_or(""), "again");
  EXPECT_TRUE(absl::IsInvalidArgument(fs.Read(root + "/a/top.txt", 3).status()))
      << "larger than asked for";
  EXPECT_EQ(fs.List(root + "/a", false), std::vector<std::string>{"top.txt"});
  EXPECT_EQ(fs.List(root + "/a", true), (std::vector<std::string>{"b/error.json", "top.txt"}));
  EXPECT_TRUE(fs.List(root + "/none", true).empty());
  fs.Remove(root + "/a/top.txt");
  fs.Remove(root + "/a/top.txt");  // gone already: no error
  EXPECT_EQ(fs.List(root + "/a", false), std::vector<std::string>{});
  ASSERT_TRUE(fs.MakeDirs(root + "/c/d").ok());
  fs.RemoveAll(root + "/a");
  EXPECT_TRUE(fs.List(root + "/a", true).empty());
  EXPECT_TRUE(absl::IsNotFound(fs.Read(root + "/a/b/error.json").status()));
}

TEST(FileSystem, TheMemoryOneBehavesAsThePosixOne) {
  const std::string dir = dlrun::testing::MakeTempDir("fs");
  Script(PosixFileSystem(), dir);
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/c/d"));
  ASSERT_TRUE(PosixFileSystem().Write(dir + "/secret", "t", 0600).ok());
  EXPECT_EQ(std::filesystem::status(dir + "/secret").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_FALSE(std::filesystem::exists(dir + "/secret.tmp"));
  std::filesystem::remove_all(dir);

  MemoryFileSystem mem;
  Script(mem, "/root");
  EXPECT_TRUE(mem.Exists("/root/c/d"));
  ASSERT_TRUE(mem.Write("/root/secret", "t", 0600).ok());
  EXPECT_EQ(mem.ModeOf("/root/secret"), 0600u);
}

}  // namespace
}  // namespace dlrun::launcher
