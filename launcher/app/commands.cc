// What every subcommand shares: its own path, and the one-line error.
#include "launcher/app/commands.h"

#include <cstdio>
#include <filesystem>
#include <string>

namespace dlrun::launcher {

int CmakePrefixPathMain() {
  const std::filesystem::path prefix = std::filesystem::path(SelfPath()).parent_path().parent_path();
  for (const char* libdir : {"lib", "lib64"}) {
    std::error_code ec;
    if (std::filesystem::exists(prefix / libdir / "cmake/dlrun/dlrunConfig.cmake", ec)) {
      return Print(prefix.string() + "\n");
    }
  }
  return FailRun(absl::NotFoundError(
      "no CMake package beside this dlrun (" + (prefix / "lib/cmake/dlrun").string() +
      "/dlrunConfig.cmake): `pip install dlrun` or `cmake --install` installs one"));
}

int Print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  return 0;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "dlrun: %s\n", std::string(s.message()).c_str());
  return 2;
}

int FailRun(const absl::Status& s) {
  Fail(s);
  return 1;
}

}  // namespace dlrun::launcher
