// The agent<->worker contract is named once: every DLRUN_* variable appears in exactly one
// non-test source file, common/contract.h (comments included, so nobody documents a name that
// can drift from the code). The one exception: comments of the installed headers
// (worker/include/), a consumer's only documentation, which may name a variable that
// common/contract.h defines, and no other. The same for torchrun's names (TORCHELASTIC_*,
// MASTER_*) and the schedulers' (SLURM_*, OMPI_*, PMIX_*, PET_*, POD_INDEX, JOB_UUID, in
// common/scheduler_env.h) as string literals of the launcher, rendezvous and worker library, and
// for the Python helper (python/), which may only use names common/contract.h defines.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/contract.h"
#include "common/scheduler_env.h"
#include "gtest/gtest.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

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
  const std::set<std::string> not_variables = {
      "DLRUN_HAVE_PMIX",    "DLRUN_RETURN_IF_ERROR", "DLRUN_SBATCH_TEMPLATE", "DLRUN_EXTRA",
      "DLRUN_WITH_CUDA",    "DLRUN_VERSION",         "DLRUN_HAVE_NVTX",       "DLRUN_PORTABLE",
      "DLRUN_UNET_NO_YAML", "DLRUN_UNET_NO_HDF5"};
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

std::string ReadText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every string literal of s that is exactly a name starting with one of `prefixes` (or equal to
// one ending in no '_'): "SLURM_JOB_ID", "MASTER_ADDR", "POD_INDEX"; not a bare "PET_".
std::vector<std::string> QuotedNames(const std::string& s, const std::vector<std::string>& prefixes) {
  std::vector<std::string> out;
  for (size_t at = s.find('"'); at != std::string::npos; at = s.find('"', at + 1)) {
    const size_t end = s.find('"', at + 1);
    if (end == std::string::npos) break;
    const std::string lit = s.substr(at + 1, end - at - 1);
    bool name = !lit.empty();
    for (char c : lit) name = name && ((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_');
    if (name) {
      for (const std::string& p : prefixes) {
        if (p.back() == '_' ? lit.size() > p.size() && lit.rfind(p, 0) == 0 : lit == p) {
          out.push_back(lit);
          break;
        }
      }
    }
    at = end;
  }
  return out;
}

TEST(Contract, TorchrunAndSchedulerNamesAreSpelledInCommonOnly) {
  const fs::path root = SOURCE_DIR;
  const std::vector<std::string> prefixes = {"TORCHELASTIC_", "MASTER_ADDR", "MASTER_PORT",
                                             "SLURM_",        "OMPI_",       "PMIX_",
                                             "PET_",          "POD_INDEX",   "JOB_UUID"};
  std::map<std::string, std::set<std::string>> files_of;
  for (const char* dir : {"common", "launcher", "rendezvous", "worker/src"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || !(ext == ".h" || ext == ".cc")) continue;
      for (const std::string& name : QuotedNames(WithoutLineComments(ReadText(e.path())), prefixes)) {
        files_of[name].insert(fs::relative(e.path(), root).string());
      }
    }
  }
  // The check finds what it looks for: both headers name some.
  ASSERT_TRUE(files_of.count(dlrun::sched::kSlurmJobId));
  ASSERT_TRUE(files_of.count(dlrun::contract::kMasterAddr));
  for (const auto& [name, files] : files_of) {
    const std::set<std::string> home =
        name.rfind("TORCHELASTIC_", 0) == 0 || name.rfind("MASTER_", 0) == 0
            ? std::set<std::string>{"common/contract.h"}
            : std::set<std::string>{"common/scheduler_env.h"};
    EXPECT_EQ(files, home) << name;
  }
}

TEST(Contract, ThePythonHelperUsesOnlyNamesTheContractDefines) {
  const fs::path root = SOURCE_DIR;
  const std::string contract = ReadText(root / "common/contract.h");
  const std::string sched = ReadText(root / "common/scheduler_env.h");
  int checked = 0;
  for (const auto& e : fs::directory_iterator(root / "python")) {
    if (e.path().extension() != ".py") continue;
    const std::string s = ReadText(e.path());
    std::vector<std::string> names = DlrunNames(s);
    for (const std::string& n : QuotedNames(s, {"TORCHELASTIC_", "MASTER_ADDR", "MASTER_PORT"})) {
      names.push_back(n);
    }
    for (const std::string& n : names) {
      ++checked;
      EXPECT_NE(contract.find("\"" + n + "\""), std::string::npos)
          << e.path().filename() << " uses " << n << ", which common/contract.h does not define";
    }
    for (const std::string& n : QuotedNames(s, {"SLURM_", "OMPI_", "PMIX_", "PET_"})) {
      ++checked;
      EXPECT_NE(sched.find("\"" + n + "\""), std::string::npos)
          << e.path().filename() << " uses " << n << ", which common/scheduler_env.h does not name";
    }
  }
  EXPECT_GT(checked, 0) << "python/dlrun_report.py reads DLRUN_HEARTBEAT_FD";
}

}  // namespace
