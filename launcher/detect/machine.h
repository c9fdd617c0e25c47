// What dlrun reads of the machine it starts workers on, once, before the plan (app/plan.h)
// decides anything: the CPUs it may use, the GPUs, the CPU topology when pinning by it, and the
// host name. The plan's functions take these facts, so unit tests pass made-up machines.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "launcher/cli/options.h"
#include "launcher/detect/gpu_pick.h"

namespace dlrun::launcher {

// What the machine says about its GPUs.
struct GpuFacts {
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES as inherited
  std::optional<std::vector<GpuLoad>> loads;   // NVML, when it loads
  int device_count = 0;                        // /dev/nvidiaN
};

// The machine's CPU groups, from sysfs (`root` is /sys; tests pass a fake tree).
struct CpuTopology {
  std::vector<std::vector<int>> numa_nodes;  // /sys/devices/system/node/nodeN/cpulist
  std::vector<std::vector<int>> sockets;     // by .../cpuN/topology/physical_package_id
};
CpuTopology ReadCpuTopology(const std::string& root = "/sys");
// A Linux CPU list ("0-3,8,10-11") as numbers; empty on a malformed list.
std::vector<int> ParseCpuList(const std::string& list);

struct Machine {
  std::vector<int> cpus;  // this process' affinity mask (what Slurm gave the step), else all
  GpuFacts gpus;          // loads only with --gpus least-loaded (NVML is slow to load)
  CpuTopology topology;   // only with --cpu-affinity node or socket
  std::string hostname;
};

// Reads the machine, as far as the options need it.
Machine DetectMachine(const LaunchOptions& o, const EnvLookup& env);

}  // namespace dlrun::launcher
