// The agent<->worker contract is named once: every DLRUN_* variable appears in exactly one
// non-test source file, common/contract.h (comments included, so nobody documents a name that
// can drift from the code).
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/contract.h"
#include "gtest/gtest.h"

namespace {

namespace fs = std::filesystem;

TEST(Contract, EveryDlrunVariableIsSpelledInOneSourceFileOnly) {
  const fs::path root = SOURCE_DIR;
  // Macros and CMake-generated names that are not environment variables.
  const std::set<std::string> not_variables = {"DLRUN_HAVE_PMIX", "DLRUN_RETURN_IF_ERROR",
                                               "DLRUN_SBATCH_TEMPLATE", "DLRUN_EXTRA",
                                               "DLRUN_WITH_CUDA"};
  std::map<std::string, std::set<std::string>> files_of;
  for (const char* dir : {"common", "launcher", "rendezvous", "worker", "examples", "proto",
                          "job_templates"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || !(ext == ".h" || ext == ".cc" || ext == ".in" || ext == ".py" ||
                                    ext == ".sbatch" || ext == ".proto")) {
        continue;
      }
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string s = text.str();
      // Every DLRUN_[A-Z][A-Z0-9_]* (no std::regex: GCC 12 warns inside <regex> at -O1).
      for (size_t at = s.find("DLRUN_"); at != std::string::npos; at = s.find("DLRUN_", at + 1)) {
        size_t end = at + 6;
        if (end >= s.size() || s[end] < 'A' || s[end] > 'Z') continue;
        while (end < s.size() && ((s[end] >= 'A' && s[end] <= 'Z') ||
                                  (s[end] >= '0' && s[end] <= '9') || s[end] == '_')) {
          ++end;
        }
        const std::string var = s.substr(at, end - at);
        if (!not_variables.count(var)) files_of[var].insert(fs::relative(e.path(), root).string());
      }
    }
  }
  ASSERT_FALSE(files_of.empty());
  EXPECT_TRUE(files_of.count(dlrun::contract::kHeartbeatFd));
  for (const auto& [var, files] : files_of) {
    EXPECT_EQ(files, std::set<std::string>{"common/contract.h"}) << var;
  }
}

}  // namespace
