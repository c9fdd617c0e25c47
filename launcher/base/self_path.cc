#include "launcher/base/self_path.h"

#include <sys/auxv.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_split.h"

namespace dlrun::launcher {
namespace {

std::string FindSelf() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && !p.empty()) return p.string();
  const char* execfn = reinterpret_cast<const char*>(getauxval(AT_EXECFN));
  if (execfn == nullptr || *execfn == '\0') return "dlrun";
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  const char* path = std::getenv("PATH");
  return ResolveExecPath(execfn, ec ? std::string("/") : cwd.string(), path ? path : "")
      .value_or("dlrun");
}

bool IsExecutableFile(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

}  // namespace

std::string SelfPath() {
  static const std::string self = FindSelf();
  return self;
}

std::optional<std::string> ResolveExecPath(const std::string& exec_path, const std::string& cwd,
                                           const std::string& path_env) {
  namespace fs = std::filesystem;
  std::optional<fs::path> found;
  if (exec_path.find('/') != std::string::npos) {
    const fs::path p =
        fs::path(exec_path).is_absolute() ? fs::path(exec_path) : fs::path(cwd) / exec_path;
    if (IsExecutableFile(p)) found = p;
  } else if (!exec_path.empty()) {
    for (absl::string_view dir : absl::StrSplit(path_env, ':')) {
      // An empty entry is the current directory, as execvp reads it.
      const fs::path d = dir.empty() ? fs::path(cwd) : fs::path(std::string(dir));
      const fs::path p = (d.is_absolute() ? d : fs::path(cwd) / d) / exec_path;
      if (IsExecutableFile(p)) {
        found = p;
        break;
      }
    }
  }
  if (!found) return std::nullopt;
  std::error_code ec;
  const fs::path canonical = fs::canonical(*found, ec);
  return ec ? found->lexically_normal().string() : canonical.string();
}

}  // namespace dlrun::launcher
