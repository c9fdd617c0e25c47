// `dlrun slurm` and `dlrun runai`: job scripts, commands and manifests that run dlrun on a
// cluster. Rendering is pure (no environment, no files) so tests check it field by field.
#pragma once

#include <string>
#include <vector>

#include "launcher/cli/job_cli.h"
#include "launcher/jobgen/shell.h"  // ShellQuote

namespace dlrun::launcher {

// Renders the sbatch script from `tmpl` (job_templates/dlrun.sbatch).
std::string RenderSlurmScript(const SlurmJobOptions& o, const std::string& tmpl);

// --preemptible and a Python program: the script that `command` runs (`python3 [opts] x.py`,
// or `x.py`), or "" when that cannot be told (`-m`, `-c`, not Python).
std::string PythonScriptOf(const std::vector<std::string>& command);
// Whether a Python source acts on the preemption warning: dlrun_report.Preemption() or its own
// SIGUSR1 handler. Without either, SIGUSR1 ends the workers instead of a checkpoint.
bool UsesPreemptionHook(const std::string& source);

// The command each pod runs (argv), the same in the CLI form and the manifest.
std::vector<std::string> RunaiPodCommand(const RunaiJobOptions& o);
// `runai training pytorch submit ...` (or `runai submit-dist pytorch ...` with legacy_cli).
std::string RenderRunaiCommand(const RunaiJobOptions& o);
// A Kubeflow PyTorchJob manifest (what Run:ai's PyTorch workloads are) for `kubectl apply`.
std::string RenderRunaiManifest(const RunaiJobOptions& o);

}  // namespace dlrun::launcher
