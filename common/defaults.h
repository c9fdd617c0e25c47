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

// Hang detection, on by default (docs/USAGE.md, "Hangs"). A rank that sends step records is
// hung when no record has come for max(kHangStepFactor x the p99 of its gaps between records,
// kHangStepFloor), once it has sent kHangMinSteps (the first steps, with their warm-up, are
// learnt from, not judged). Any program: when every rank has used under kHangIdleCores of
// CPU and none was busy off the CPU (storage reads, waiting for a CPU), and every GPU the
// node's NVML sees has been under kHangIdleGpu busy, for kHangIdleBound, the agent says where
// each rank is (one line, from a stack dump); with --hang-timeout it then stops the group.
// Measured on train_unet (bench/RESULTS.md, "Hang detection"): the longest gap between two
// records over 10 minutes, checkpoint saves included, was 1.3 x p99, so 20 leaves room for a
// slower node.
inline constexpr double kHangStepFactor = 20;
inline constexpr std::chrono::milliseconds kHangStepFloor{60000};
inline constexpr int kHangMinSteps = 5;
inline constexpr double kHangIdleCores = 0.05;
inline constexpr double kHangIdleGpu = 0.05;
inline constexpr std::chrono::milliseconds kHangIdleBound{30000};

// Preflight (docs/USAGE.md "Preflight and bad nodes"): each node's checks before it joins a round. The compute
// probe multiplies kPreflightGemmSize-square float matrices on one core for kPreflightQuick
// (--preflight full: kPreflightFull) and reports GFLOP/s; the rendezvous leaves out a node whose
// figure is under kPreflightSlowRatio x the round's median (the upper median: with two nodes,
// the faster one), or fails the job when the round cannot do without it. A node whose
// checkpoint directory has under kPreflightMinFreeBytes free, or whose GPUs report
// uncorrected ECC errors or retired pages pending, fails its own check.
inline constexpr int kPreflightGemmSize = 96;
inline constexpr std::chrono::milliseconds kPreflightQuick{400};
inline constexpr std::chrono::milliseconds kPreflightFull{3000};
inline constexpr double kPreflightSlowRatio = 0.5;
inline constexpr unsigned long long kPreflightMinFreeBytes = 1ULL << 30;

}  // namespace dlrun::defaults
