#include "rendezvous/telemetry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace dlrun::rdzv {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

JobTelemetry::JobTelemetry(TelemetryOptions options)
    : options_(std::move(options)),
      start_(std::chrono::steady_clock::now()),
      next_window_(start_ + options_.window) {}

void JobTelemetry::Update(const std::string& node_id, const std::string& hostname,
                          const NodeTelemetry& t, TimePoint now) {
  std::lock_guard<std::mutex> lock(mu_);
  NodeTelemetry& n = nodes_seen_[node_id];  // its GPUs and lost time (ranks are kept below)
  n.hostname = hostname;
  n.lost_s = t.lost_s;
  n.memory_limit_bytes = t.memory_limit_bytes;
  n.gpus = t.gpus;
  bool stepping = false;
  for (const RankTelemetry& r : t.ranks) stepping |= r.steps > 0;
  for (GpuTelemetry& g : n.gpus) {
    g.host = hostname;
    GpuAcc& acc = gpu_acc_[{hostname, g.index}];
    acc.peak = std::max(acc.peak, g.memory_used_bytes);
    if (stepping) {  // start-up (GPUs idle while the program imports and loads) is left out
      acc.sum += g.utilization;
      ++acc.n;
    }
  }
  for (const RankTelemetry& r : t.ranks) {
    RankTelemetry& mine = ranks_[r.rank];
    mine = r;
    mine.host = hostname;
    window_start_.try_emplace(r.rank);  // a new rank's first window starts at zero
  }
  CloseWindows(now);
}

void JobTelemetry::SetJob(const std::string& run_id, uint64_t round, int world_size, int nodes,
                          int restarts) {
  std::lock_guard<std::mutex> lock(mu_);
  run_id_ = run_id;
  round_ = round;
  world_size_ = world_size;
  nodes_ = nodes;
  restarts_ = restarts;
  // Ranks beyond the new world size belong to an earlier, larger round.
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    if (world_size > 0 && it->first >= world_size) {
      window_start_.erase(it->first);
      streak_.erase(it->first);
      it = ranks_.erase(it);
    } else {
      ++it;
    }
  }
}

void JobTelemetry::AddRestartCause(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (causes_.size() < 100) causes_.push_back(cause);
}

void JobTelemetry::SetState(const std::string& state) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = state;
}

void JobTelemetry::CloseWindows(TimePoint now) {
  // Updates come once a period from each node, not exactly on the window's edge: a tenth of a
  // window early still closes it, and the next edge stays on the grid.
  if (now + options_.window / 10 < next_window_) return;
  std::map<int, Window> deltas;
  double samples = 0;
  std::vector<double> means;
  double slowest = 0;
  for (const auto& [rank, r] : ranks_) {
    Window& w = window_start_[rank];
    Window d;
    d.steps = r.steps - w.steps;
    d.step_s = r.step_s - w.step_s;
    d.busy_s = r.compute_s + r.data_s - w.busy_s;
    d.sync_s = r.sync_s - w.sync_s;
    if (d.steps > 0) {
      deltas[rank] = d;
      means.push_back(d.step_s / static_cast<double>(d.steps));
      slowest = std::max(slowest, means.back());
    }
    samples += static_cast<double>(r.samples - w.samples);
    w = {r.steps, r.samples, r.step_s, r.compute_s + r.data_s, r.sync_s};
  }
  const double span_s =
      std::chrono::duration<double>(now - (next_window_ - options_.window)).count();
  HistoryPoint p;
  p.t = std::chrono::duration<double>(now - start_).count();
  p.step_time_s = Median(means);
  p.step_time_max_s = slowest;
  p.samples_per_sec = span_s > 0 ? samples / span_s : 0;
  p.restarts = restarts_;
  if (!means.empty()) {
    if (first_step_window_ < 0) first_step_window_ = windows_;
    history_.push_back(p);
    while (history_.size() > options_.history) history_.pop_front();
  }
  ++windows_;
  Judge(deltas);
  next_window_ = std::max(next_window_ + options_.window, now + options_.window / 2);
}

namespace {

std::string Hint(const RankTelemetry& r, double data_per_step, double busy_per_step,
                 const std::vector<GpuTelemetry>& gpus) {
  if (busy_per_step > 0 && data_per_step > 0.5 * busy_per_step) {
    return "waiting for data: more --num-data-workers or prefetching";
  }
  for (const GpuTelemetry& g : gpus) {
    if (g.host == r.host && g.utilization < 0.5) return "GPU idle: look at the input pipeline and CPU work";
  }
  if (r.cpu_utilization && *r.cpu_utilization >= 0.9) {
    return "CPU-bound: more CPU cores per rank, or less work on the CPU";
  }
  if (r.cpu_utilization && *r.cpu_utilization < 0.5) {
    return "stalled off the CPU: stopped, throttled by a CPU quota, or waiting for I/O";
  }
  return "slower compute on this host: check its clocks, temperature and neighbours";
}

}  // namespace

void JobTelemetry::Judge(const std::map<int, Window>& deltas) {
  // With the compute/sync split (the DDP engine reports it): the rank whose work before the
  // sync is longest and whose wait inside it is shortest holds everybody up.
  std::vector<double> busy, sync;
  for (const auto& [rank, d] : deltas) {
    if (!ranks_[rank].has_split) continue;
    busy.push_back(d.busy_s / static_cast<double>(d.steps));
    sync.push_back(d.sync_s / static_cast<double>(d.steps));
  }
  std::map<int, std::pair<double, double>> above;  // rank -> (its figure, the median)
  std::map<int, double> its_sync;
  std::string metric;
  double median_sync = -1;
  if (busy.size() >= 2) {
    metric = "compute";
    const double mb = Median(busy);
    median_sync = Median(sync);
    for (const auto& [rank, d] : deltas) {
      if (!ranks_[rank].has_split) continue;
      const double b = d.busy_s / static_cast<double>(d.steps);
      const double s = d.sync_s / static_cast<double>(d.steps);
      if (mb > 0 && b > options_.straggler_factor * mb && s <= median_sync) {
        above[rank] = {b, mb};
        its_sync[rank] = s;
      }
    }
  } else {
    // Step times alone cannot tell (every rank waits for the slowest): a CPU-bound rank uses
    // more CPU than the ranks waiting for it.
    std::vector<double> cpu;
    for (const auto& [rank, d] : deltas) {
      const auto& u = ranks_[rank].cpu_utilization;
      if (u) cpu.push_back(*u);
    }
    if (cpu.size() >= 2) {
      metric = "cpu";
      const double mc = Median(cpu);
      for (const auto& [rank, d] : deltas) {
        const auto& u = ranks_[rank].cpu_utilization;
        if (u && mc > 0.05 && *u > options_.straggler_factor * mc) above[rank] = {*u, mc};
      }
    }
  }
  for (const auto& [rank, d] : deltas) {
    auto it = above.find(rank);
    if (it == above.end()) {
      streak_[rank] = 0;
      if (auto s = stragglers_.find(rank); s != stragglers_.end()) s->second.active = false;
      continue;
    }
    const int streak = ++streak_[rank];
    if (streak < options_.straggler_windows) continue;
    const RankTelemetry& r = ranks_[rank];
    Straggler& s = stragglers_[rank];
    const bool first = s.window == 0;
    s.rank = rank;
    s.host = r.host;
    s.busy_s = it->second.first;
    s.median_busy_s = it->second.second;
    s.sync_s = its_sync.count(rank) ? its_sync[rank] : -1;
    s.median_sync_s = metric == "compute" ? median_sync : -1;
    s.metric = metric;
    std::vector<GpuTelemetry> gpus;
    for (const auto& [id, n] : nodes_seen_) gpus.insert(gpus.end(), n.gpus.begin(), n.gpus.end());
    const double data =
        r.has_data && r.steps > 0 ? r.data_s / static_cast<double>(r.steps) : 0;
    s.hint = metric == "cpu" ? "CPU-bound: more CPU cores per rank, or less work on the CPU"
                             : Hint(r, data, s.busy_s, gpus);
    if (first) s.window = windows_;
    s.active = true;
    if (first && options_.on_straggler) {
      std::string line =
          metric == "compute"
              ? absl::StrFormat("straggler: rank %d on %s computes %.3f s per step before the "
                                "gradient sync against the job's median %.3f s (x%.2f), and "
                                "waits %.3f s in it against %.3f s, for %d windows: %s",
                                rank, r.host, s.busy_s, s.median_busy_s,
                                s.busy_s / s.median_busy_s, s.sync_s, median_sync, streak,
                                s.hint)
              : absl::StrFormat("straggler: rank %d on %s uses %.0f%% of a CPU against the "
                                "job's median %.0f%%, for %d windows: %s",
                                rank, r.host, 100 * s.busy_s, 100 * s.median_busy_s, streak,
                                s.hint);
      options_.on_straggler(line);
    }
  }
}

JobTelemetry::Snapshot JobTelemetry::Snap(TimePoint now) const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.run_id = run_id_;
  s.state = state_;
  s.round = round_;
  s.world_size = world_size_;
  s.nodes = nodes_;
  s.restarts = restarts_;
  s.restart_causes = causes_;
  s.wall_s = std::chrono::duration<double>(now - start_).count();
  s.windows = windows_;
  s.first_step_window = first_step_window_;
  s.ranks = ranks_;
  for (const auto& [id, n] : nodes_seen_) {
    s.lost_s = std::max(s.lost_s, n.lost_s);
    for (GpuTelemetry g : n.gpus) {
      auto acc = gpu_acc_.find({g.host, g.index});
      if (acc != gpu_acc_.end()) {
        if (acc->second.n > 0) g.mean_utilization = acc->second.sum / static_cast<double>(acc->second.n);
        g.peak_memory_used_bytes = acc->second.peak;
      }
      s.gpus.push_back(g);
    }
  }
  for (const auto& [rank, st] : stragglers_) s.stragglers.push_back(st);
  std::map<std::string, Snapshot::NodeMemory> mem;
  for (const auto& [id, n] : nodes_seen_) {
    if (n.memory_limit_bytes > 0) mem[n.hostname] = {n.hostname, 0, n.memory_limit_bytes};
  }
  for (const auto& [rank, r] : ranks_) {
    auto it = mem.find(r.host);
    if (it != mem.end()) it->second.peak_rss_bytes += r.rss_peak_bytes;
  }
  for (auto& [host, m] : mem) s.node_memory.push_back(m);
  s.history.assign(history_.begin(), history_.end());
  for (const auto& [rank, r] : ranks_) {
    if (r.step_s > 0) s.samples_per_sec += static_cast<double>(r.samples) / r.step_s;
  }
  return s;
}

namespace {

// The slowest rank: in synchronous DDP every step lasts as long as the slowest rank's, so with
// the split it is the one with the most work before the sync; else the longest median step.
// `what` says which figure it is.
int SlowestRank(const std::map<int, RankTelemetry>& ranks, double* figure, std::string* what) {
  bool split = true;
  for (const auto& [rank, r] : ranks) split &= r.has_split && r.steps > 0;
  int best = -1;
  *figure = -1;
  for (const auto& [rank, r] : ranks) {
    const double v = split ? (r.compute_s + r.data_s) / static_cast<double>(r.steps) : r.step_p50_s;
    if (v > *figure) {
      *figure = v;
      best = rank;
    }
  }
  *what = split ? "compute and data wait per step before the sync" : "step time p50";
  return best;
}

nlohmann::json OrNull(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
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
  j["restart_causes"] = s.restart_causes;
  j["samples_per_sec"] = s.samples_per_sec;
  json ranks = json::object();
  double slowest = -1;
  int slowest_rank = -1;
  for (const auto& [rank, r] : s.ranks) {
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
    for (const Straggler& st : s.stragglers) straggler |= st.rank == rank && st.active;
    x["straggler"] = straggler;
    ranks[std::to_string(rank)] = x;
  }
  j["ranks"] = ranks;
  std::string slowest_what;
  slowest_rank = SlowestRank(s.ranks, &slowest, &slowest_what);
  j["slowest_rank"] = slowest_rank >= 0 ? json(slowest_rank) : json();
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
  j["gpus"] = gpus;
  json nodes = json::array();
  for (const auto& m : s.node_memory) {
    nodes.push_back({{"host", m.host}, {"peak_rss_bytes", m.peak_rss_bytes},
                     {"memory_limit_bytes", m.limit_bytes}});
  }
  j["node_memory"] = nodes;
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

std::string FormatJobReport(const JobTelemetry::Snapshot& s, int exit_code) {
  std::string out = absl::StrFormat(
      "job report: %s after %.1f s wall (%.1f s lost to %d restart(s) and rendezvous), %d "
      "rank(s) on %d node(s), %.2f samples/s",
      exit_code == 0 ? "succeeded" : absl::StrCat("failed (exit ", exit_code, ")"), s.wall_s,
      s.lost_s, s.restarts, static_cast<int>(s.ranks.size()), std::max(1, s.nodes),
      s.samples_per_sec);
  for (size_t i = 0; i < s.restart_causes.size() && i < 5; ++i) {
    absl::StrAppend(&out, "\n  restart ", i + 1, ": ", s.restart_causes[i]);
  }
  double slowest = -1, cpu_sum = 0, wall_cpu = 0, peak_rss = 0, data_max = 0;
  int slowest_rank = -1, cpu_n = 0;
  for (const auto& [rank, r] : s.ranks) {
    std::string line = absl::StrFormat("\n  rank %d (%s): %d steps, step time p50 %.3f s, p95 %.3f s",
                                       rank, r.host, r.steps, r.step_p50_s, r.step_p95_s);
    if (r.has_data && r.step_s > 0) {
      absl::StrAppend(&line, absl::StrFormat(", data wait %.0f%%", 100 * r.data_s / r.step_s));
      data_max = std::max(data_max, r.data_s / r.step_s);
    }
    if (r.has_split && r.steps > 0) {
      absl::StrAppend(&line, absl::StrFormat(", compute %.3f s + sync wait %.3f s per step",
                                             r.compute_s / static_cast<double>(r.steps),
                                             r.sync_s / static_cast<double>(r.steps)));
    }
    if (r.cpu_utilization) {
      absl::StrAppend(&line, absl::StrFormat(", CPU %.0f%%", 100 * *r.cpu_utilization));
    }
    if (r.rss_peak_bytes > 0) {
      absl::StrAppend(&line, absl::StrFormat(", peak RSS %.0f MiB", r.rss_peak_bytes / 1048576.0));
    }
    absl::StrAppend(&out, line);
    if (r.cpu_s > 0) {
      cpu_sum += r.cpu_s;
      ++cpu_n;
    }
    peak_rss = std::max(peak_rss, static_cast<double>(r.rss_peak_bytes));
  }
  wall_cpu = s.wall_s * cpu_n;
  std::string slowest_what;
  slowest_rank = SlowestRank(s.ranks, &slowest, &slowest_what);
  if (slowest_rank >= 0 && s.ranks.size() > 1) {
    absl::StrAppend(&out, absl::StrFormat("\n  slowest rank: %d (%s %.3f s)", slowest_rank,
                                          slowest_what, slowest));
  }
  if (wall_cpu > 0) {
    absl::StrAppend(&out, absl::StrFormat("\n  CPU efficiency: %.0f%% of one core per rank "
                                          "(%.1f CPU-s over %.1f rank-s)",
                                          100 * cpu_sum / wall_cpu, cpu_sum, wall_cpu));
  }
  // Each GPU's utilisation averaged over the job's stepping time (the last sample when none
  // was taken while stepping); the report gives their mean and the least-used GPU's.
  double gpu_min = 2, gpu_sum = 0, gpu_mem_peak = 0, gpu_mem_total = 0;
  for (const GpuTelemetry& g : s.gpus) {
    const double u = g.mean_utilization.value_or(g.utilization);
    gpu_min = std::min(gpu_min, u);
    gpu_sum += u;
    const double peak = static_cast<double>(std::max(g.peak_memory_used_bytes, g.memory_used_bytes));
    if (peak > gpu_mem_peak) {
      gpu_mem_peak = peak;
      gpu_mem_total = static_cast<double>(g.memory_total_bytes);
    }
  }
  const double gpu_mean = s.gpus.empty() ? -1 : gpu_sum / static_cast<double>(s.gpus.size());
  if (!s.gpus.empty()) {
    absl::StrAppend(&out, absl::StrFormat("\n  GPU utilization: mean %.0f%%, min %.0f%% over %d "
                                          "GPU(s); peak memory %.1f of %.1f GiB",
                                          100 * gpu_mean, 100 * gpu_min,
                                          static_cast<int>(s.gpus.size()), gpu_mem_peak / 1073741824.0,
                                          gpu_mem_total / 1073741824.0));
  }
  // Advice, from the guides this project grew from (docs/TELEMETRY.md).
  std::vector<std::string> advice;
  if (data_max > 0.1 && (gpu_mean < 0 || gpu_mean < 0.9)) {
    advice.push_back(absl::StrFormat(
        "ranks wait for data %.0f%% of a step: raise --num-data-workers or prefetch more", 100 * data_max));
  }
  if (gpu_mean >= 0 && gpu_mean < 0.9 && data_max <= 0.1) {
    advice.push_back("GPU utilization is under 90%: a larger batch per GPU, or fewer GPUs");
  }
  if (gpu_mem_total > 0 && gpu_mem_peak > 0.9 * gpu_mem_total) {
    advice.push_back("GPU memory is near its limit: mixed precision (--amp), gradient "
                     "accumulation or activation checkpointing");
  }
  for (const auto& m : s.node_memory) {
    if (m.limit_bytes > 0 && m.peak_rss_bytes > 0.9 * static_cast<double>(m.limit_bytes)) {
      advice.push_back(absl::StrFormat(
          "the ranks on %s peaked at %.1f GiB of its %.1f GiB memory limit: smaller batches or "
          "crops, fewer data workers, mixed precision or activation checkpointing",
          m.host, m.peak_rss_bytes / 1073741824.0, m.limit_bytes / 1073741824.0));
    }
  }
  for (const Straggler& st : s.stragglers) {
    advice.push_back(absl::StrFormat("rank %d on %s was a straggler (%s): %s", st.rank, st.host,
                                     st.metric, st.hint));
  }
  if (s.restarts > 0 && s.lost_s > 0.1 * s.wall_s) {
    advice.push_back("restarts cost more than 10% of the wall time: checkpoint more often, or "
                     "use warm spares (--spare-workers)");
  }
  (void)peak_rss;
  for (const std::string& a : advice) absl::StrAppend(&out, "\n  advice: ", a);
  return out;
}

}  // namespace dlrun::rdzv
