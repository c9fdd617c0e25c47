// The agent<->worker contract is named once: every DLRUN_* variable appears in exactly one
// non-test source file, common/contract.h (comments included, so nobody documents a name that
// can drift from the code). The one exception: comments of the installed headers
// (worker/include/), a consumer's only documentation, which may name a variable that
// common/contract.h defines, and no other.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/contract.h"
#include "gtest/gtest.h"

namespace {

namespace fs = std::filesystem;

// Every DLRUN_[A-Z][A-Z0-9_]* in s (no std::regex: GCC 12 warns inside <regex> at -O1).
std::vector<std::string> DlrunNames(const std::string& s) {
  std::vector<std::string> names;
  for (size_t at = s.find("DLRUN_"); at != std::string::npos; at = s.find("DLRUN_", at + 1)) {
    size_t end = at + 6;
    if (end >= s.size() || s[end] < 'A' || s[end] > 'Z') continue;
    while (end < s.size() && ((s[end] >= 'A' && s[end] <= 'Z') ||
                              (s[end] >= '0' && s[end] <= '9') || s[end] == '_')) {
      ++end;
    }
    names.push_back(s.substr(at, end - at));
  }
  return names;
}

// The text with every `// ...` comment (to the end of its line) removed.
std::string WithoutLineComments(const std::string& s) {
  std::string out;
  for (size_t at = 0; at < s.size();) {
    const size_t comment = s.find("//", at);
    if (comment == std::string::npos) {
      out.append(s, at, std::string::npos);
      break;
    }
    out.append(s, at, comment - at);
    at = s.find('\n', comment);
    if (at == std::string::npos) break;
  }
  return out;
}

TEST(Contract, EveryDlrunVariableIsSpelledInOneSourceFileOnly) {
  const fs::path root = SOURCE_DIR;
  // Macros and CMake-generated names that are not environment variables.
  const std::set<std::string> not_variables = {"DLRUN_HAVE_PMIX", "DLRUN_RETURN_IF_ERROR",
                                               "DLRUN_SBATCH_TEMPLATE", "DLRUN_EXTRA",
                                               "DLRUN_WITH_CUDA", "DLRUN_VERSION"};
  std::map<std::string, std::set<std::string>> files_of;
  std::map<std::string, std::set<std::string>> documented;  // in installed headers' comments
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
      std::string s = text.str();
      // Installed headers are a consumer's documentation and must name the variables their
      // comments talk about (a consumer has no common/contract.h): their comments are not code.
      if (fs::relative(e.path(), root).string().rfind("worker/include/", 0) == 0) {
        for (const std::string& var : DlrunNames(s)) documented[var].insert(e.path().string());
        s = WithoutLineComments(s);
      }
      for (const std::string& var : DlrunNames(s)) {
        if (!not_variables.count(var)) files_of[var].insert(fs::relative(e.path(), root).string());
      }
    }
  }
  ASSERT_FALSE(files_of.empty());
  EXPECT_TRUE(files_of.count(dlrun::contract::kHeartbeatFd));
  for (const auto& [var, files] : files_of) {
    EXPECT_EQ(files, std::set<std::string>{"common/contract.h"}) << var;
  }
  for (const auto& [var, files] : documented) {
    if (not_variables.count(var)) continue;
    EXPECT_TRUE(files_of.count(var)) << var << " is named in " << *files.begin()
                                     << " but not defined in common/contract.h";
  }
}

}  // namespace
