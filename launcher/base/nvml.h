// NVML, the one loader: dlopen'ed (contract::kNvmlLibrary, else libnvidia-ml.so.1), so dlrun builds
// without NVML's header and runs on machines without a driver. Used to pick GPUs at start
// (gpu_pick) and by the agent's resource sampler (agent/resource_sampler).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace dlrun::launcher {

// One GPU as NVML reports it; a figure NVML could not give is unset.
struct NvmlGpu {
  int index = 0;
  std::optional<uint64_t> memory_used, memory_total;  // bytes
  std::optional<unsigned> utilization;                // percent of the last sample period
  std::vector<std::pair<pid_t, uint64_t>> processes;  // compute processes, GPU memory in bytes
};

// One GPU's health for the preflight (base/preflight.h); a figure NVML could not give is unset.
struct NvmlHealth {
  std::optional<uint64_t> ecc_uncorrected;     // volatile count, since the driver loaded
  std::optional<bool> retired_pages_pending;   // pages waiting for retirement (before Ampere)
  std::optional<bool> row_remap_pending;       // a row remap waiting for a reset (Ampere on)
  std::optional<bool> row_remap_failed;        // a row remap failed: the GPU needs service
};

class Nvml {
 public:
  // Loaded and initialised (nvmlInit is slow on real drivers: keep the object), or nullptr when
  // the library is missing, lacks an entry point, or fails to initialise.
  static std::unique_ptr<Nvml> Load();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The first `max_gpus` GPUs now, with their compute processes when asked (and the driver has
  // nvmlDeviceGetComputeRunningProcesses_v3); nullopt when NVML cannot count the devices.
  std::optional<std::vector<NvmlGpu>> Query(size_t max_gpus, bool with_processes) const;
  // GPU `index`'s health; nullopt when NVML has no such GPU.
  std::optional<NvmlHealth> Health(int index) const;

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace dlrun::launcher
