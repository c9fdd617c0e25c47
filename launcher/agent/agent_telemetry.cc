// The agent's side of telemetry (docs/TELEMETRY.md): this node's figures from the step records
// and the sampler, published every period through the membership source, and the end-of-job
// report. The supervision loop (agent.cc) calls MaybePublish() between events.
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "launcher/agent/agent.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

SteadyTime Agent::PublishDue() const {
  return options_.telemetry ? next_publish_ : SteadyTime::max();
}

void Agent::MaybePublish(bool now_anyway, bool all_steps) {
  if (!options_.telemetry) return;
  const SteadyTime now = clock_.Now();
  if (!now_anyway && now < next_publish_) return;
  next_publish_ = now + options_.telemetry_period;
  if (!sampler_ && !now_anyway && options_.sample_processes) {
    sampler_ = std::make_unique<ResourceSampler>(options_.telemetry_period);
    std::vector<pid_t> pids;
    for (const Worker& w : workers_) {
      if (w.alive) pids.push_back(w.pid);
    }
    sampler_->Watch(std::move(pids));
  }
  source_->Publish(NodeFigures(all_steps));
}

namespace {

// The latest `n` step times of a rank's ring (kept in step order up to kMaxStepTimes, then
// overwritten at steps % kMaxStepTimes).
std::vector<double> LatestStepTimes(const Agent::RankSteps& r, size_t n) {
  const std::vector<double>& ring = r.step_times;
  n = std::min(n, ring.size());
  if (ring.size() < Agent::kMaxStepTimes) return {ring.end() - static_cast<std::ptrdiff_t>(n), ring.end()};
  const size_t end = static_cast<size_t>(r.steps) % Agent::kMaxStepTimes;  // one past the latest
  std::vector<double> v;
  v.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    v.push_back(ring[(end + Agent::kMaxStepTimes - n + k) % Agent::kMaxStepTimes]);
  }
  return v;
}

void SetPercentiles(std::vector<double> v, rdzv::RankTelemetry* x) {
  if (v.empty()) return;
  auto at = [&v](double p) {
    const size_t k = static_cast<size_t>(std::lround(p * static_cast<double>(v.size() - 1)));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  };
  x->step_p50_s = at(0.5);
  x->step_p95_s = at(0.95);
}

}  // namespace

void Agent::AddProcessFigures(const Worker& w, const std::map<pid_t, ProcSample>& procs,
                              rdzv::RankTelemetry* x) {
  if (auto p = procs.find(w.pid); p != procs.end()) {
    ProcSample& last = proc_last_[w.rank];
    const int64_t peak = std::max(last.rss_peak_bytes, p->second.rss_peak_bytes);
    last = p->second;
    last.rss_peak_bytes = peak;
    // A new pid for this rank: what the earlier process used is kept in the base.
    auto& seen = cpu_seen_[w.pid];
    seen = std::max(seen, p->second.cpu_s);
  }
  if (auto l = proc_last_.find(w.rank); l != proc_last_.end()) {
    if (w.alive) {
      x->cpu_utilization = l->second.cpu_utilization;
      x->rss_bytes = l->second.rss_bytes;
    }
    x->rss_peak_bytes = l->second.rss_peak_bytes;
    x->gpu_memory_bytes = l->second.gpu_memory_bytes;
  }
  auto seen = cpu_seen_.find(w.pid);
  x->cpu_s = cpu_base_[w.rank] + (seen != cpu_seen_.end() ? seen->second : 0.0);
}

rdzv::NodeTelemetry Agent::NodeFigures(bool all_steps) {
  rdzv::NodeTelemetry t;
  t.hostname = options_.hostname;
  t.lost_s = lost_s_;
  if (options_.sample_processes) {
    static const int64_t limit = MemoryLimitBytes();  // read once
    t.memory_limit_bytes = limit;
  }
  std::map<pid_t, ProcSample> procs;
  if (sampler_) {
    procs = sampler_->Latest();
    t.gpus = sampler_->Gpus();
  }
  std::map<int, const Worker*> by_rank;
  for (const Worker& w : workers_) by_rank[w.rank] = &w;
  // Ranks with steps, and the current workers (a program that reports nothing still gets its
  // process figures).
  std::map<int, int> ranks;  // rank -> local rank
  for (const auto& [rank, r] : rank_steps_) ranks[rank] = rank - current_.rank_offset;
  for (const auto& [rank, w] : by_rank) ranks[rank] = w->local_rank;
  for (const auto& [rank, local] : ranks) {
    rdzv::RankTelemetry x;
    x.rank = rank;
    x.local_rank = local;
    if (auto it = rank_steps_.find(rank); it != rank_steps_.end()) {
      const RankSteps& r = it->second;
      x.steps = r.steps;
      x.samples = r.samples;
      x.step_s = r.step_s;
      x.data_s = r.data_s;
      x.compute_s = r.compute_s;
      x.sync_s = r.sync_s;
      x.has_data = r.has_data;
      x.has_split = r.has_split;
      x.loss = r.loss;
      // Periodic figures use the latest steps only (cheap on the restart path); the report
      // uses every step the ring holds.
      SetPercentiles(LatestStepTimes(r, all_steps ? kMaxStepTimes : 1024), &x);
    }
    if (auto w = by_rank.find(rank); w != by_rank.end()) {
      AddProcessFigures(*w->second, procs, &x);
    } else {
      x.cpu_s = cpu_base_[rank];
    }
    t.ranks.push_back(std::move(x));
  }
  return t;
}

// The end-of-job report (docs/TELEMETRY.md): the job's, where this agent holds the job-wide
// aggregate (a single-node job, or the rendezvous host), else this node's. Printed when telemetry
// is on and any rank reported anything; written as JSON with --report-json.
void Agent::Report(int rc, double wall_s) {
  const SteadyTime now = clock_.Now();
  std::shared_ptr<rdzv::JobTelemetry> job = options_.telemetry ? source_->job_telemetry() : nullptr;
  const bool whole = job != nullptr;
  if (!whole) {
    job = std::make_shared<rdzv::JobTelemetry>();
    job->SetJob(current_.run_id, current_.round, current_.world_size, 1, current_.restart_count);
    job->Update("local", options_.hostname, NodeFigures(/*all_steps=*/true), now);
  }
  job->SetState(rc == 0 ? "succeeded" : "failed");
  rdzv::JobTelemetry::Snapshot snap = job->Snap(now);
  snap.wall_s = wall_s;
  if (!whole) snap.restarts = current_.restart_count;
  // Over the whole job, CPU utilisation is CPU time over wall time (not the last sample).
  for (auto& [rank, r] : snap.ranks) {
    if (r.cpu_s > 0 && wall_s > 0) r.cpu_utilization = r.cpu_s / wall_s;
  }
  bool any = false;
  for (const auto& [rank, r] : snap.ranks) any |= r.steps > 0 || r.cpu_s > 0;
  if (options_.telemetry && any) {
    std::string text = rdzv::FormatJobReport(snap, rc);
    if (!whole) text.replace(0, std::string("job report").size(), "job report (this node)");
    if (bad_records_ > 0) absl::StrAppend(&text, "\n  malformed step records dropped: ", bad_records_);
    spdlog::info("{}", text);
  }
  if (!options_.report_json.empty()) {
    nlohmann::json j = nlohmann::json::parse(rdzv::SnapshotJson(snap, false));
    j["exit_code"] = rc;
    j["bad_records"] = bad_records_;
    j["scope"] = whole ? "job" : "node";
    rusage self{};
    getrusage(RUSAGE_SELF, &self);  // the agent's own CPU time (threads included, workers not)
    j["agent_cpu_s"] = static_cast<double>(self.ru_utime.tv_sec + self.ru_stime.tv_sec) +
                       1e-6 * static_cast<double>(self.ru_utime.tv_usec + self.ru_stime.tv_usec);
    const std::string tmp = options_.report_json + ".tmp";
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    out.close();
    if (!out || std::rename(tmp.c_str(), options_.report_json.c_str()) != 0) {
      spdlog::error("cannot write the report to {}: {}", options_.report_json, std::strerror(errno));
    } else {
      spdlog::info("report written to {}", options_.report_json);
    }
  }
}

}  // namespace dlrun::launcher
