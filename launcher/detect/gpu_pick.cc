#include "launcher/detect/gpu_pick.h"

#include <cstdlib>

#include "common/contract.h"
#include <dlfcn.h>

#include <algorithm>

namespace dlrun::launcher {
namespace {

// The few NVML entry points used, declared here so no NVML header is needed to build.
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlUtilization {
  unsigned int gpu, memory;
};
using NvmlDevice = void*;
using InitFn = int (*)();
using CountFn = int (*)(unsigned*);
using HandleFn = int (*)(unsigned, NvmlDevice*);
using MemFn = int (*)(NvmlDevice, NvmlMemory*);
using UtilFn = int (*)(NvmlDevice, NvmlUtilization*);
using ShutdownFn = int (*)();

}  // namespace

std::optional<std::vector<GpuLoad>> QueryGpuLoads() {
  const char* path = std::getenv(contract::kNvmlLibrary);
  void* lib = dlopen(path != nullptr && *path != '\0' ? path : "libnvidia-ml.so.1",
                     RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::nullopt;
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto mem = reinterpret_cast<MemFn>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  auto util = reinterpret_cast<UtilFn>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
  auto shutdown = reinterpret_cast<ShutdownFn>(dlsym(lib, "nvmlShutdown"));
  std::optional<std::vector<GpuLoad>> out;
  unsigned n = 0;
  if (init && count && handle && mem && util && shutdown && init() == 0) {
    if (count(&n) == 0) {
      out.emplace();
      for (unsigned i = 0; i < n; ++i) {
        NvmlDevice d = nullptr;
        NvmlMemory m{};
        NvmlUtilization u{};
        if (handle(i, &d) != 0) continue;
        GpuLoad g;
        g.index = static_cast<int>(i);
        if (mem(d, &m) == 0) {
          g.memory_used = m.used;
          g.memory_total = std::max<unsigned long long>(1, m.total);
        }
        if (util(d, &u) == 0) g.utilization = u.gpu;
        out->push_back(g);
      }
    }
    shutdown();
  }
  dlclose(lib);
  return out;
}

std::vector<int> PickLeastLoaded(std::vector<GpuLoad> gpus, int n) {
  auto score = [](const GpuLoad& g) {
    return 100.0 * static_cast<double>(g.memory_used) / static_cast<double>(g.memory_total) +
           g.utilization;
  };
  std::stable_sort(gpus.begin(), gpus.end(), [&](const GpuLoad& a, const GpuLoad& b) {
    return score(a) != score(b) ? score(a) < score(b) : a.index < b.index;
  });
  std::vector<int> out;
  for (int i = 0; i < n && i < static_cast<int>(gpus.size()); ++i) out.push_back(gpus[i].index);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dlrun::launcher
