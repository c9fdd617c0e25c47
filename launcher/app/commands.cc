// What every subcommand shares: its own path, and the one-line error.
#include "launcher/app/commands.h"

#include <cstdio>
#include <filesystem>
#include <string>

namespace dlrun::launcher {

std::string SelfPath() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("dlrun") : p.string();
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
