// What each worker runs (part of the launch plan, launcher/app/plan.h): the command line as
// torchrun makes it, the warm spare's and fork server's Python bootstrap around it, the workers'
// interpreter and dlrun's Python helpers beside them, and the check that the program can run
// before any worker starts. Pure functions, but for the files they look at.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/cli/options.h"

namespace dlrun::launcher {

// What each worker runs: torchrun runs .py files and -m modules with `python` ($PYTHON_EXEC,
// else python3 on PATH) and -u (unbuffered).
std::vector<std::string> WorkerArgv(const LaunchOptions& o, const std::string& python);
// Whether workers run under the Python interpreter (they then get PYTHONUNBUFFERED=1).
bool RunsPython(const LaunchOptions& o);

// A warm spare's command for a worker running `argv` (docs/RECOVERY.md), or empty when there is
// none: only for `python[X.Y] [flags] SCRIPT ARGS` and `python [flags] -m MODULE ARGS`. The
// spare is the same interpreter with the same flags, running a small bootstrap (-c,
// spare_bootstrap.py) that imports torch ahead of need, then waits on kSpareFd for the worker's
// environment and runs the script or module as __main__ with the same arguments.
std::vector<std::string> WarmSpareArgv(const std::vector<std::string>& argv);
// The same spare command with its bootstrap in DIR/spare_bootstrap.py (the run directory), so
// its `ps` line is "python -u -c exec(open('DIR/spare_bootstrap.py').read()) train.py", not
// the 2 KB script; as given when the file cannot be written.
std::vector<std::string> SpareArgvFromFile(const std::vector<std::string>& spare_argv,
                                           const std::string& dir);

// The workers' interpreter: PYTHON_EXEC, else python3 beside dlrun when dlrun lives in a virtual
// or conda environment (it was pip-installed there), else python3 on PATH as an absolute path
// (the first in an absolute directory of the environment's PATH), else plain "python3".
std::string DefaultPython(const EnvLookup& env);

// The directory of dlrun's Python helper (dlrun_report.py) for the dlrun at `exe`:
// EXE_DIR/../share/dlrun/python, installed and in the build tree alike; empty when it is not there.
std::string PythonHelperDir(const std::string& exe);

// Before any worker starts: the worker program (argv[0], searched in `path` as execvp does)
// exists and may be executed, and the Python script, when there is one, may be read. The error
// names the program and the reason (not found, permission denied).
absl::Status CheckProgram(const std::vector<std::string>& argv, const std::string& script,
                          const std::string& path);

}  // namespace dlrun::launcher
