// The run directory (run_dir.h).
#include "launcher/app/run_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

std::string RunLogDirTemplate(const std::string& log_dir, const std::string& run_id,
                              const std::string& hostname, bool multinode) {
  return absl::StrCat(log_dir, "/", run_id, multinode ? "_" + hostname : std::string(), "_XXXXXX");
}

std::string RunDir(const std::string& tmpdir, unsigned uid, const std::string& run_id, int pid) {
  return absl::StrCat(tmpdir.empty() ? "/tmp" : tmpdir, "/dlrun-", uid, "/", run_id, "-", pid);
}

absl::StatusOr<std::string> MakeRunDir(const LaunchOptions& o, const std::string& run_id,
                                       const std::string& hostname, const EnvLookup& env,
                                       bool* keep) {
  const std::string tmp = env("TMPDIR").value_or("/tmp");
  const bool redirected = o.redirects.Any() || o.tee.Any();
  *keep = !o.log_dir.empty() || redirected;
  if (!*keep) return RunDir(tmp, getuid(), run_id, getpid());
  std::string base = o.log_dir;
  if (base.empty()) base = absl::StrCat(tmp, "/dlrun-", getuid(), "/logs");
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  std::string templ = RunLogDirTemplate(base, run_id, hostname, o.max_nodes > 1);
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a log directory in '", base,
                                                   "': ", std::strerror(errno)));
  }
  if (o.log_dir.empty()) spdlog::info("worker output is kept in {} (no --log-dir given)", templ);
  return templ;
}

}  // namespace dlrun::launcher
