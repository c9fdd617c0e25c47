// Defaults that several parts of dlrun share, each declared once: the ports (torchrun's own,
// so a job moves between the launchers unchanged), how workers are stopped, and telemetry.
// Flag help texts are built from these constants. Plain constants, no dependencies.
#pragma once

#include <chrono>

namespace dlrun::defaults {

inline constexpr int kRdzvPort = 29400;    // the rendezvous server (torchrun's c10d rendezvous)
inline constexpr int kMasterPort = 29500;  // MASTER_PORT: the c10d store of node rank 0

// Stopping workers: the forwarded signal (SIGTERM), then SIGKILL after this (torchrun's 30 s).
inline constexpr std::chrono::milliseconds kGracePeriod{30000};

// Worker-group restarts of the jobs `dlrun slurm` and `dlrun runai` write (dlrun itself, as
// torchrun, defaults to 0).
inline constexpr int kJobMaxRestarts = 3;

// Telemetry (docs/TELEMETRY.md): no HTTP unless --metrics-port is given; it binds every
// interface. A rank is a straggler when its compute per step stays above the job's median by
// kStragglerFactor for kStragglerWindows consecutive windows of kTelemetryWindow.
inline constexpr int kMetricsPortOff = -1;
inline constexpr char kMetricsAddr[] = "0.0.0.0";
inline constexpr double kStragglerFactor = 1.2;
inline constexpr int kStragglerWindows = 3;
inline constexpr std::chrono::milliseconds kTelemetryWindow{1000};

// Stack dumps (docs/STACKS.md): `dlrun stacks --timeout`'s default, and how long an agent's own
// dump for a job-wide one may take.
inline constexpr std::chrono::milliseconds kStacksBound{5000};

}  // namespace dlrun::defaults
