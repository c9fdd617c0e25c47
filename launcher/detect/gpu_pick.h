// Choosing GPUs for workers: NVML (loaded with dlopen, so machines without a driver still run
// dlrun) reports memory used and utilisation; the least-loaded GPUs win, as the DGX
// GPU-picking script does with nvidia-smi.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlrun::launcher {

struct GpuLoad {
  int index = 0;
  uint64_t memory_used = 0;
  uint64_t memory_total = 1;
  unsigned utilization = 0;  // percent
};

// The GPUs of this node from NVML, or nullopt when libnvidia-ml cannot be loaded or fails.
std::optional<std::vector<GpuLoad>> QueryGpuLoads();

// The `n` least-loaded GPUs (score: percent of memory used + percent utilisation; ties by
// index), in ascending index order so local rank order follows the devices.
std::vector<int> PickLeastLoaded(std::vector<GpuLoad> gpus, int n);

}  // namespace dlrun::launcher
