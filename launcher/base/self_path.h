// Where this dlrun executable is: what `--cmake-prefix-path`, the workers' default interpreter
// (a virtual environment's bin/python3 beside dlrun), the Python helpers' directory and the
// rendezvous library are found from.
#pragma once

#include <optional>
#include <string>

namespace dlrun::launcher {

// This executable's path, symlinks resolved: /proc/self/exe, or where /proc is not mounted (a
// chroot, some sandboxes) the path it was started by (the auxiliary vector's AT_EXECFN,
// resolved as ResolveExecPath does); "dlrun" when neither says. Computed once.
std::string SelfPath();

// The absolute path of the file `exec_path` names, as execve found it: with a '/', relative to
// `cwd`; without one, the first executable `exec_path` in PATH's directories. nullopt when none
// is found. Symlinks are resolved (as /proc/self/exe does).
std::optional<std::string> ResolveExecPath(const std::string& exec_path, const std::string& cwd,
                                           const std::string& path_env);

}  // namespace dlrun::launcher
