#include "launcher/base/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include "common/contract.h"

namespace dlrun::launcher {
// Named, not anonymous: Nvml::Api's fields use them (-Wsubobject-linkage in a unity build).
namespace nvml_abi {

// The NVML types used, declared here so no NVML header is needed to build.
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlProcessInfo {  // nvmlProcessInfo_t (v2/v3 layout)
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};

constexpr unsigned kMaxProcesses = 64;

}  // namespace nvml_abi
using namespace nvml_abi;  // NOLINT: this file's own declarations

struct Nvml::Api {
  void* lib = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, void**) = nullptr;
  int (*mem)(void*, NvmlMemory*) = nullptr;
  int (*util)(void*, NvmlUtilization*) = nullptr;
  int (*procs)(void*, unsigned*, NvmlProcessInfo*) = nullptr;  // optional (older drivers)
  int (*shutdown)() = nullptr;
  // Health (optional: a driver or GPU without them leaves the figure unset).
  int (*ecc)(void*, int, int, unsigned long long*) = nullptr;
  int (*retired_pending)(void*, int*) = nullptr;
  int (*remapped)(void*, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;
};

std::unique_ptr<Nvml> Nvml::Load() {
  const char* path = std::getenv(contract::kNvmlLibrary);
  void* lib = dlopen(path != nullptr && *path != '\0' ? path : "libnvidia-ml.so.1",
                     RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return nullptr;
  auto a = std::make_unique<Api>();
  a->lib = lib;
  auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
  a->count = reinterpret_cast<int (*)(unsigned*)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  a->handle =
      reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  a->mem = reinterpret_cast<int (*)(void*, NvmlMemory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  a->util = reinterpret_cast<int (*)(void*, NvmlUtilization*)>(
      dlsym(lib, "nvmlDeviceGetUtilizationRates"));
  a->procs = reinterpret_cast<int (*)(void*, unsigned*, NvmlProcessInfo*)>(
      dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  a->shutdown = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"));
  a->ecc = reinterpret_cast<int (*)(void*, int, int, unsigned long long*)>(
      dlsym(lib, "nvmlDeviceGetTotalEccErrors"));
  a->retired_pending =
      reinterpret_cast<int (*)(void*, int*)>(dlsym(lib, "nvmlDeviceGetRetiredPagesPendingStatus"));
  a->remapped = reinterpret_cast<int (*)(void*, unsigned*, unsigned*, unsigned*, unsigned*)>(
      dlsym(lib, "nvmlDeviceGetRemappedRows"));
  if (!init || !a->count || !a->handle || !a->mem || !a->util || !a->shutdown || init() != 0) {
    dlclose(lib);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(a)));
}

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(api_->lib);
}

std::optional<std::vector<NvmlGpu>> Nvml::Query(size_t max_gpus, bool with_processes) const {
  unsigned n = 0;
  if (api_->count(&n) != 0) return std::nullopt;
  std::vector<NvmlGpu> out;
  for (unsigned i = 0; i < n && i < max_gpus; ++i) {
    void* d = nullptr;
    if (api_->handle(i, &d) != 0) continue;
    NvmlGpu g;
    g.index = static_cast<int>(i);
    NvmlMemory m{};
    if (api_->mem(d, &m) == 0) {
      g.memory_used = m.used;
      g.memory_total = m.total;
    }
    NvmlUtilization u{};
    if (api_->util(d, &u) == 0) g.utilization = u.gpu;
    if (with_processes && api_->procs != nullptr) {
      NvmlProcessInfo infos[kMaxProcesses];
      unsigned count = kMaxProcesses;
      if (api_->procs(d, &count, infos) == 0) {
        for (unsigned k = 0; k < count && k < kMaxProcesses; ++k) {
          g.processes.emplace_back(static_cast<pid_t>(infos[k].pid), infos[k].used_gpu_memory);
        }
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

std::optional<NvmlHealth> Nvml::Health(int index) const {
  void* d = nullptr;
  if (index < 0 || api_->handle(static_cast<unsigned>(index), &d) != 0) return std::nullopt;
  NvmlHealth h;
  constexpr int kUncorrected = 1, kVolatile = 0;  // nvmlMemoryErrorType_t, nvmlEccCounterType_t
  unsigned long long ecc = 0;
  if (api_->ecc != nullptr && api_->ecc(d, kUncorrected, kVolatile, &ecc) == 0) {
    h.ecc_uncorrected = ecc;
  }
  int pending = 0;
  if (api_->retired_pending != nullptr && api_->retired_pending(d, &pending) == 0) {
    h.retired_pages_pending = pending != 0;
  }
  unsigned corrected = 0, uncorrected = 0, remap_pending = 0, remap_failed = 0;
  if (api_->remapped != nullptr &&
      api_->remapped(d, &corrected, &uncorrected, &remap_pending, &remap_failed) == 0) {
    h.row_remap_pending = remap_pending != 0;
    h.row_remap_failed = remap_failed != 0;
  }
  return h;
}

}  // namespace dlrun::launcher
