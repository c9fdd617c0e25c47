#include "telemetry/summary.h"

namespace dlrun::telemetry {

GpuSummary SummariseGpus(const std::vector<GpuTelemetry>& gpus) {
  GpuSummary g;
  double sum = 0;
  for (const GpuTelemetry& x : gpus) {
    const double u = x.mean_utilization.value_or(x.utilization);
    g.min = std::min(g.min, u);
    sum += u;
    const double peak = static_cast<double>(std::max(x.peak_memory_used_bytes, x.memory_used_bytes));
    if (peak > g.mem_peak) {
      g.mem_peak = peak;
      g.mem_total = static_cast<double>(x.memory_total_bytes);
    }
  }
  g.count = static_cast<int>(gpus.size());
  if (!gpus.empty()) g.mean = sum / static_cast<double>(gpus.size());
  return g;
}

CpuSummary SummariseCpus(const JobTelemetry::Snapshot& s) {
  CpuSummary c;
  for (const auto& m : s.node_memory) {
    if (m.cpus <= 0 || m.ranks == 0) continue;
    c.allocated += m.cpus;
    c.used_s += m.cpu_s;
    c.core_walltime_s += m.cpus * s.wall_s;
    if (c.source.empty()) c.source = m.cpus_source;
    ++c.nodes;
  }
  return c;
}

int SlowestRank(const std::map<int, RankTelemetry>& ranks, double* figure, std::string* what) {
  bool split = true;
  for (const auto& [rank, r] : ranks) split &= r.has_split && r.steps > 0;
  int best = -1;
  *figure = -1;
  for (const auto& [rank, r] : ranks) {
    if (r.steps == 0) continue;  // no step records: nothing says it is slow
    const double v = split ? (r.compute_s + r.data_s) / static_cast<double>(r.steps) : r.step_p50_s;
    if (v > *figure) {
      *figure = v;
      best = rank;
    }
  }
  *what = split ? "compute and data wait per step before the sync" : "step time p50";
  return best;
}

}  // namespace dlrun::telemetry
