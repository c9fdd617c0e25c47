#include "telemetry/telemetry.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dlrun::telemetry {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void RestartCost::Add(const RestartCost& b) {
  restarts += b.restarts;
  in_process_tries += b.in_process_tries;
  started_forked += b.started_forked;
  started_spare += b.started_spare;
  started_cold += b.started_cold;
  detection_s += b.detection_s;
  stop_s += b.stop_s;
  rendezvous_s += b.rendezvous_s;
  start_s += b.start_s;
  checkpoint_load_s += b.checkpoint_load_s;
  state_from_peer_s += b.state_from_peer_s;
  recomputed_s += b.recomputed_s;
  recomputed_steps += b.recomputed_steps;
}

RestartCost SumOfRestartCosts(const std::vector<RestartCost>& costs) {
  RestartCost sum;
  sum.restarts = 0;
  for (const RestartCost& c : costs) sum.Add(c);
  return sum;
}

JobTelemetry::JobTelemetry(TelemetryOptions options)
    : options_(std::move(options)),
      start_(std::chrono::steady_clock::now()),
      next_window_(start_ + options_.window) {}

void JobTelemetry::Update(const std::string& node_id, const std::string& hostname,
                          NodeTelemetry t, TimePoint now) {
  // The node's ranks and profiles are kept by rank below; its own figures whole (a new
  // node-level field needs nothing here), without them.
  const std::vector<RankTelemetry> ranks = std::exchange(t.ranks, {});
  const std::vector<RankProfile> profiles = std::exchange(t.profiles, {});
  t.hostname = hostname;
  std::lock_guard<std::mutex> lock(mu_);
  NodeTelemetry& n = nodes_seen_[node_id];
  // A node keeps sending its last capture: a new one is one that differs from what it sent.
  if (!t.stacks_json.empty() && t.stacks_json != n.stacks_json) stacks_json_ = t.stacks_json;
  n = std::move(t);
  for (const RankProfile& p : profiles) {
    RankProfile& mine = profiles_[p.rank];
    mine = p;
    mine.host = hostname;
  }
  bool stepping = false;
  for (const RankTelemetry& r : ranks) stepping |= r.steps > 0;
  for (GpuTelemetry& g : n.gpus) {
    g.host = hostname;
    GpuAcc& acc = gpu_acc_[{hostname, g.index}];
    acc.peak = std::max(acc.peak, g.memory_used_bytes);
    if (stepping) {  // start-up (GPUs idle while the program imports and loads) is left out
      acc.sum += g.utilization;
      ++acc.n;
    }
  }
  for (const RankTelemetry& r : ranks) {
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
  max_world_size_ = std::max(max_world_size_, world_size);
  max_nodes_ = std::max(max_nodes_, nodes);
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
  UpdateStragglers(deltas);
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

// The warning line when `st` is first named, after `streak` windows.
std::string WarningLine(const Straggler& st, int streak) {
  if (st.metric == "compute") {
    return absl::StrFormat("straggler: rank %d on %s computes %.3f s per step before the gradient "
                           "sync against the job's median %.3f s (x%.2f), and waits %.3f s in it "
                           "against %.3f s, for %d windows: %s",
                           st.rank, st.host, st.busy_s, st.median_busy_s,
                           st.busy_s / st.median_busy_s, st.sync_s, st.median_sync_s, streak,
                           st.hint);
  }
  return absl::StrFormat("straggler: rank %d on %s uses %.0f%% of a CPU against the job's median "
                         "%.0f%%, for %d windows: %s",
                         st.rank, st.host, 100 * st.busy_s, 100 * st.median_busy_s, streak, st.hint);
}

}  // namespace

void JobTelemetry::UpdateStragglers(const std::map<int, Window>& deltas) {
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
    if (first && options_.on_straggler) options_.on_straggler(WarningLine(s, streak));
  }
}

JobTelemetry::Snapshot JobTelemetry::TakeSnapshot(TimePoint now) const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.stacks_json = stacks_json_;
  s.profiles = profiles_;
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
  s.max_world_size = max_world_size_;
  s.max_nodes = max_nodes_;
  // Each restart (and each in-process generation within it) as the node that lost the most to
  // it saw it: the job resumes when its last node does.
  std::map<std::pair<int, int>, RestartCost> costs;
  double lost_max = 0;
  for (const auto& [id, n] : nodes_seen_) {
    lost_max = std::max(lost_max, n.lost_s);
    s.productive_s = std::max(s.productive_s, n.productive_s);
    for (RestartCost c : n.restarts) {
      c.host = n.hostname;
      auto [it, added] = costs.try_emplace(std::make_pair(c.restart, c.generation), c);
      if (!added && c.total_s() > it->second.total_s()) it->second = c;
    }
  }
  for (auto& [k, c] : costs) {
    s.lost_s += c.total_s();
    s.restart_costs.push_back(std::move(c));
  }
  if (costs.empty()) s.lost_s = lost_max;
  for (const auto& [id, n] : nodes_seen_) {
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
  s.warm_spares = !nodes_seen_.empty();
  for (const auto& [id, n] : nodes_seen_) {
    s.warm_spares &= n.warm_spares;
    if (n.memory_limit_bytes > 0 || n.cpus_allocated > 0) {
      Snapshot::NodeMemory& m = mem[n.hostname];
      m.host = n.hostname;
      m.spare_rss_bytes += n.spare_rss_peak_bytes;
      m.limit_bytes = n.memory_limit_bytes;
      m.limit_source = n.memory_limit_source;
      m.cpus = n.cpus_allocated;
      m.cpus_source = n.cpus_source;
    }
    if (s.program.empty()) s.program = n.program;
    s.agent_cpu_s += n.agent_cpu_s;
  }
  for (const auto& [rank, r] : ranks_) {
    auto it = mem.find(r.host);
    if (it == mem.end()) continue;
    it->second.peak_rss_bytes += r.rss_peak_bytes;
    it->second.cpu_s += r.cpu_s;
    ++it->second.ranks;
  }
  for (auto& [host, m] : mem) s.node_memory.push_back(m);
  s.history.assign(history_.begin(), history_.end());
  for (const auto& [rank, r] : ranks_) {
    if (r.step_s > 0) s.samples_per_sec += static_cast<double>(r.samples) / r.step_s;
  }
  return s;
}

}  // namespace dlrun::telemetry
