// The job-wide telemetry as JSON (`/api/job`, `--report-json`; docs/TELEMETRY.md).
#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "telemetry/profile_json.h"
#include "telemetry/summary.h"
#include "telemetry/telemetry.h"

namespace dlrun::telemetry {
namespace {

nlohmann::json OrNull(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

nlohmann::json RankJson(int rank, const RankTelemetry& r, const std::vector<Straggler>& stragglers) {
  using nlohmann::json;
  json x;
  x["host"] = r.host;
  x["local_rank"] = r.local_rank;
  x["steps"] = r.steps;
  x["samples"] = r.samples;
  x["step_time_p50_s"] = r.step_p50_s;
  x["step_time_p95_s"] = r.step_p95_s;
  x["samples_per_sec"] = r.step_s > 0 ? static_cast<double>(r.samples) / r.step_s : 0.0;
  x["data_wait_fraction"] = r.has_data && r.step_s > 0 ? json(r.data_s / r.step_s) : json();
  x["compute_s_per_step"] =
      r.has_split && r.steps > 0 ? json(r.compute_s / static_cast<double>(r.steps)) : json();
  x["sync_wait_s_per_step"] =
      r.has_split && r.steps > 0 ? json(r.sync_s / static_cast<double>(r.steps)) : json();
  x["cpu_utilization"] = OrNull(r.cpu_utilization);
  x["cpu_seconds"] = r.cpu_s;
  x["rss_bytes"] = r.rss_bytes;
  x["rss_peak_bytes"] = r.rss_peak_bytes;
  x["gpu_memory_bytes"] = r.gpu_memory_bytes >= 0 ? json(r.gpu_memory_bytes) : json();
  x["loss"] = OrNull(r.loss);
  bool straggler = false;
  for (const Straggler& st : stragglers) straggler |= st.rank == rank && st.active;
  x["straggler"] = straggler;
  return x;
}

// The restart ledger: every restart's phases, and their sums.
nlohmann::json LostJson(const JobTelemetry::Snapshot& s) {
  using nlohmann::json;
  auto phases = [](const RestartCost& c) {
    json j = json::object();
    for (const auto& [name, v] : c.Phases()) j[std::string(name) + "_s"] = v;
    return j;
  };
  json list = json::array();
  for (const RestartCost& c : s.restart_costs) {
    json x = phases(c);
    x.update({{"restart", c.restart},
              {"restarts", c.restarts},
              {"in_process_recoveries", c.recoveries()},
              {"group_restarts", c.group_restarts()},
              {"started", {{"forked", c.started_forked}, {"spare", c.started_spare},
                           {"cold", c.started_cold}}},
              {"host", c.host},
              {"recomputed_steps", c.recomputed_steps},
              {"fault_step", c.fault_step >= 0 ? json(c.fault_step) : json()},
              {"resumed_step", c.resumed_step >= 0 ? json(c.resumed_step) : json()},
              {"resumed", c.resumed},
              {"in_process", c.in_process},
              {"admission", c.admission},
              {"generation", c.generation},
              {"total_s", c.total_s()}});
    list.push_back(std::move(x));
  }
  const RestartCost sum = SumOfRestartCosts(s.restart_costs);
  return {{"total_s", s.lost_s},
          {"by_phase", phases(sum)},
          {"recomputed_steps", sum.recomputed_steps},
          {"restarts", list}};
}

// The job's GPUs, nodes (memory and CPUs allocated) and the efficiency figures, into `j`.
void AddResourcesJson(const JobTelemetry::Snapshot& s, nlohmann::json* j) {
  using nlohmann::json;
  json gpus = json::array();
  for (const GpuTelemetry& g : s.gpus) {
    gpus.push_back({{"host", g.host},
                    {"gpu", g.index},
                    {"utilization", g.utilization},
                    {"mean_utilization", OrNull(g.mean_utilization)},
                    {"memory_used_bytes", g.memory_used_bytes},
                    {"peak_memory_used_bytes", g.peak_memory_used_bytes},
                    {"memory_total_bytes", g.memory_total_bytes}});
  }
  (*j)["gpus"] = gpus;
  json nodes = json::array();
  for (const auto& m : s.node_memory) {
    nodes.push_back({{"host", m.host}, {"peak_rss_bytes", m.peak_rss_bytes},
                     {"memory_limit_bytes", m.limit_bytes},
                     {"memory_limit_source", m.limit_source},
                     {"cpus_allocated", m.cpus > 0 ? json(m.cpus) : json()},
                     {"cpus_source", m.cpus_source},
                     {"cpu_seconds", m.cpu_s}});
  }
  (*j)["node_memory"] = nodes;
  (*j)["program"] = s.program;
  const CpuSummary cpus = SummariseCpus(s);
  (*j)["cpu_efficiency"] = cpus.efficiency() >= 0 ? json(cpus.efficiency()) : json();
  (*j)["cpus_allocated"] = cpus.allocated > 0 ? json(cpus.allocated) : json();
  const GpuSummary g = SummariseGpus(s.gpus);
  (*j)["gpus_needed_at_90_percent"] = s.gpus.empty() ? json() : json(g.NeededAt90());
}

}  // namespace

std::string SnapshotJson(const JobTelemetry::Snapshot& s, bool with_history) {
  using nlohmann::json;
  json j;
  j["job"] = {{"run_id", s.run_id},   {"state", s.state},           {"round", s.round},
              {"world_size", s.world_size}, {"nodes", s.nodes},     {"wall_s", s.wall_s},
              {"lost_s", s.lost_s},   {"windows", s.windows},
              {"first_step_window", s.first_step_window}};
  j["wall_s"] = s.wall_s;
  j["restarts"] = s.restarts;
  j["job"]["max_world_size"] = s.max_world_size;
  j["job"]["max_nodes"] = s.max_nodes;
  j["lost"] = LostJson(s);
  j["goodput"] = s.wall_s > 0 ? json(std::min(1.0, s.productive_s / s.wall_s)) : json();
  j["productive_s"] = s.productive_s;
  j["restart_causes"] = s.restart_causes;
  j["samples_per_sec"] = s.samples_per_sec;
  j["stacks"] = s.stacks_json.empty() ? json()
                                      : json::parse(s.stacks_json, nullptr, /*allow_exceptions=*/false);
  // --profile (docs/PROFILING.md): each profiled rank's file, and what the capture says.
  json profiles = json::object(), details = json::array();
  for (const auto& [rank, p] : s.profiles) {
    if (!p.path.empty()) profiles[std::to_string(rank)] = p.path;
    details.push_back(ProfileDetailJson(p));  // keyed by p.rank (JobTelemetry)
  }
  j["profiles"] = std::move(profiles);
  j["profile_details"] = std::move(details);
  json ranks = json::object();
  for (const auto& [rank, r] : s.ranks) ranks[std::to_string(rank)] = RankJson(rank, r, s.stragglers);
  j["ranks"] = ranks;
  double slowest = -1;
  std::string slowest_what;
  const int slowest_rank = SlowestRank(s.ranks, &slowest, &slowest_what);
  j["slowest_rank"] = slowest_rank >= 0 ? json(slowest_rank) : json();
  AddResourcesJson(s, &j);
  json stragglers = json::array();
  for (const Straggler& st : s.stragglers) {
    stragglers.push_back({{"rank", st.rank},
                          {"host", st.host},
                          {"metric", st.metric},
                          {"value", st.busy_s},
                          {"median", st.median_busy_s},
                          {"sync_wait_s", st.sync_s >= 0 ? json(st.sync_s) : json()},
                          {"median_sync_wait_s", st.median_sync_s >= 0 ? json(st.median_sync_s) : json()},
                          {"hint", st.hint},
                          {"window", st.window},
                          {"active", st.active}});
  }
  j["stragglers"] = stragglers;
  if (with_history) {
    json h = json::array();
    for (const HistoryPoint& p : s.history) {
      h.push_back({{"t", p.t},
                   {"step_time_s", p.step_time_s},
                   {"step_time_max_s", p.step_time_max_s},
                   {"samples_per_sec", p.samples_per_sec},
                   {"restarts", p.restarts}});
    }
    j["history"] = h;
  }
  return j.dump(2);
}

nlohmann::json ProfileDetailJson(const RankProfile& p) {
  nlohmann::json hot = nlohmann::json::array();
  for (const auto& [frame, fraction] : p.hot) hot.push_back({{"frame", frame}, {"fraction", fraction}});
  return {{"rank", p.rank}, {"host", p.host}, {"tool", p.tool}, {"path", p.path},
          {"hot", std::move(hot)}, {"note", p.note}, {"samples", p.samples}};
}

}  // namespace dlrun::telemetry
