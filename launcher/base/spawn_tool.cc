#include "launcher/base/spawn_tool.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>

#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace dlrun::launcher {
namespace {

void Redirect(posix_spawn_file_actions_t* fa, int target, int fd, const std::string& path) {
  if (fd >= 0) {
    posix_spawn_file_actions_adddup2(fa, fd, target);
  } else if (!path.empty()) {
    posix_spawn_file_actions_addopen(fa, target, path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  } else {
    posix_spawn_file_actions_addopen(fa, target, "/dev/null", O_WRONLY, 0);
  }
}

}  // namespace

absl::StatusOr<pid_t> SpawnTool(const ToolSpawn& s) {
  if (s.argv.empty()) return absl::InvalidArgumentError("cannot run a tool without a command");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  Redirect(&fa, 1, s.stdout_fd, s.stdout_path);
  Redirect(&fa, 2, s.stderr_fd, s.stderr_path);
  if (s.fd3 >= 0) posix_spawn_file_actions_adddup2(&fa, s.fd3, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (s.own_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);
  std::vector<char*> args;
  for (const std::string& a : s.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot run ", s.argv[0], ": ", std::strerror(rc)));
  }
  return pid;
}

}  // namespace dlrun::launcher
