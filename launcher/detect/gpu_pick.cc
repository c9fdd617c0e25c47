#include "launcher/detect/gpu_pick.h"

#include <algorithm>
#include <limits>

#include "launcher/base/nvml.h"

namespace dlrun::launcher {

std::optional<std::vector<GpuLoad>> QueryGpuLoads() {
  auto nvml = Nvml::Load();
  if (!nvml) return std::nullopt;
  auto gpus = nvml->Query(std::numeric_limits<size_t>::max(), /*with_processes=*/false);
  if (!gpus) return std::nullopt;
  std::vector<GpuLoad> out;
  for (const NvmlGpu& g : *gpus) {
    GpuLoad l;
    l.index = g.index;
    if (g.memory_used && g.memory_total) {
      l.memory_used = *g.memory_used;
      l.memory_total = std::max<uint64_t>(1, *g.memory_total);
    }
    l.utilization = g.utilization.value_or(0);
    out.push_back(l);
  }
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
