// The run directory (run_dir.h).
#include "launcher/app/run_location.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

std::string RunLogDirTemplate(const std::string& log_dir, const std::string& run_id,
                              const std::string& hostname, bool multinode) {
  return absl::StrCat(log_dir, "/", run_id, multinode ? "_" + hostname : std::string(), "_XXXXXX");
}

std::string ScratchRunDir(const std::string& tmpdir, unsigned uid, const std::string& run_id, int pid) {
  return absl::StrCat(tmpdir.empty() ? "/tmp" : tmpdir, "/dlrun-", uid, "/", run_id, "-", pid);
}

absl::StatusOr<std::string> MakeRunDir(const LaunchOptions& o, const std::string& run_id,
                                       const std::string& hostname, const EnvLookup& env,
                                       bool* keep) {
  const std::string tmp = env("TMPDIR").value_or("/tmp");
  const bool redirected = o.redirects.Any() || o.tee.Any();
  *keep = !o.log_dir.empty() || redirected || o.profile.On();  // profiles are kept
  if (!*keep) return ScratchRunDir(tmp, getuid(), run_id, getpid());
  std::string base = o.log_dir;
  if (base.empty()) base = absl::StrCat(tmp, "/dlrun-", getuid(), "/logs");
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  if (ec) {  // a read-only or missing parent: its own reason, not mkdtemp's ENOENT below
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create the log directory '", base, "': ", ec.message()));
  }
  std::string templ = RunLogDirTemplate(base, run_id, hostname, o.max_nodes > 1);
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a log directory in '", base,
                                                   "': ", std::strerror(errno)));
  }
  if (o.log_dir.empty()) spdlog::info("worker output is kept in {} (no --log-dir given)", templ);
  return templ;
}

std::string RunIndexDir(const std::string& tmpdir, unsigned uid) {
  return absl::StrCat(tmpdir.empty() ? "/tmp" : tmpdir, "/dlrun-", uid, "/jobs");
}

namespace {
bool Alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }
}  // namespace

std::vector<LiveRun> LiveRuns(const std::string& index_dir) {
  std::vector<LiveRun> out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(index_dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(it->path().filename().string(), &pid) || !Alive(pid)) continue;
    std::error_code lec;
    const auto target = std::filesystem::read_symlink(it->path(), lec);
    if (lec || !std::filesystem::is_directory(target, lec)) continue;
    out.push_back({pid, target.string()});
  }
  std::sort(out.begin(), out.end(),
            [](const LiveRun& a, const LiveRun& b) { return a.agent_pid < b.agent_pid; });
  return out;
}

void RegisterRun(const std::string& index_dir, int agent_pid, const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(index_dir, ec);
  // Links of agents that are gone (killed before they could remove theirs).
  for (auto it = std::filesystem::directory_iterator(index_dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    int pid = 0;
    std::error_code rec;
    if (absl::SimpleAtoi(it->path().filename().string(), &pid) && !Alive(pid)) {
      std::filesystem::remove(it->path(), rec);
    }
  }
  const std::string link = absl::StrCat(index_dir, "/", agent_pid);
  std::filesystem::remove(link, ec);
  std::filesystem::create_directory_symlink(std::filesystem::absolute(run_dir, ec), link, ec);
  if (ec) spdlog::debug("cannot register the run in {}: {}", index_dir, ec.message());
}

void UnregisterRun(const std::string& index_dir, int agent_pid) {
  std::error_code ec;
  std::filesystem::remove(absl::StrCat(index_dir, "/", agent_pid), ec);
}

}  // namespace dlrun::launcher
