// This node's telemetry (agent_telemetry.h): step records and samples in, figures published
// every period, the report at the end.
#include "launcher/workers/agent_telemetry.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cpus.h"
#include "launcher/workers/process_facts.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

// The agent's own CPU time (its threads included, the workers not).
double AgentCpuSeconds() {
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  return CpuSeconds(self);
}

// The ledger's start kinds: of `members` not in `before` (the new processes).
void CountStarts(const std::vector<AgentTelemetry::Member>& members,
                 const std::vector<AgentTelemetry::Member>& before, RestartLedger* ledger) {
  int n[4] = {0, 0, 0, 0};  // by StartKind
  for (const AgentTelemetry::Member& m : members) {
    const bool kept = std::any_of(before.begin(), before.end(),
                                  [&](const AgentTelemetry::Member& b) { return b.pid == m.pid; });
    if (!kept) ++n[static_cast<int>(m.start)];
  }
  ledger->StartedAs(n[static_cast<int>(StartKind::kForked)], n[static_cast<int>(StartKind::kSpare)],
                    n[static_cast<int>(StartKind::kCold)]);
}

}  // namespace

AgentTelemetry::AgentTelemetry(TelemetryOptions options, std::string hostname, JobChannel& source,
                               Clock& clock, FileSystem& fs)
    : options_(std::move(options)),
      hostname_(std::move(hostname)),
      source_(source),
      fs_(fs),
      clock_(clock) {}

AgentTelemetry::~AgentTelemetry() = default;

void AgentTelemetry::Start() {
  if (options_.on) next_publish_ = clock_.Now() + options_.period;
}

void AgentTelemetry::GroupStarted(std::vector<Member> members, const Assignment& group,
                                  SteadyTime assigned_at) {
  ledger_.GroupStarted(static_cast<int>(group.restart_count), assigned_at, clock_.Now());
  CountStarts(members, {}, &ledger_);
  world_size_ = group.world_size;
  max_world_size_ = std::max(max_world_size_, group.world_size);
  max_nodes_ = std::max(max_nodes_, group.num_nodes);
  steps_.NewGroup();
  for (const Member& m : members_) {  // the CPU time of the group that ended stays counted
    if (auto it = cpu_seen_.find(m.pid); it != cpu_seen_.end()) {
      cpu_base_[m.rank] += it->second;
      cpu_seen_.erase(it);
    }
  }
  members_ = std::move(members);
  if (!members_.empty()) rank_offset_ = members_.front().rank - members_.front().local_rank;
  WatchMembersAndSpares();
  if (options_.serve_metrics && !metrics_) {
    if (auto t = source_.job_telemetry()) metrics_ = options_.serve_metrics(std::move(t));
  }
}

void AgentTelemetry::Replaced(std::vector<Member> members, const Assignment& group, SteadyTime t,
                              int generation) {
  ledger_.Stopped(t);
  ledger_.GroupStarted(static_cast<int>(group.restart_count), t, clock_.Now(), generation);
  CountStarts(members, members_, &ledger_);
  for (const Member& m : members_) {  // a lost rank's CPU time stays counted
    const bool kept = std::any_of(members.begin(), members.end(),
                                  [&](const Member& n) { return n.pid == m.pid; });
    if (auto it = cpu_seen_.find(m.pid); !kept && it != cpu_seen_.end()) {
      cpu_base_[m.rank] += it->second;
      cpu_seen_.erase(it);
    }
  }
  members_ = std::move(members);
  WatchMembersAndSpares();
}

void AgentTelemetry::WatchMembersAndSpares() {
  if (!sampler_) return;
  std::vector<pid_t> pids;
  for (const Member& m : members_) {
    if (m.alive) pids.push_back(m.pid);
  }
  pids.insert(pids.end(), spare_pids_.begin(), spare_pids_.end());
  sampler_->Watch(std::move(pids), spare_pids_);
}

void AgentTelemetry::SetSpares(std::vector<pid_t> pids) {
  if (pids == spare_pids_) return;
  spare_pids_ = std::move(pids);
  WatchMembersAndSpares();
}

void AgentTelemetry::Exited(pid_t pid, double cpu_s, int64_t rss_peak_bytes) {
  for (Member& m : members_) {
    if (m.pid != pid) continue;
    m.alive = false;
    if (cpu_s >= 0) {  // the whole of it: the sampler's last read may be a period old
      auto& seen = cpu_seen_[pid];
      seen = std::max(seen, cpu_s);
    }
    // The kernel's high-water mark: a peak the sampler missed between its reads, and the only
    // figure where /proc cannot be read (a chroot without it).
    auto& peak = proc_last_[m.rank].rss_peak_bytes;
    peak = std::max(peak, rss_peak_bytes);
  }
}

void AgentTelemetry::Step(pid_t pid, const StepRecord& step) {
  for (const Member& m : members_) {
    if (m.pid != pid) continue;
    if (step.kind == RecordKind::kResumed) {  // a resume, not a step
      ledger_.Resumed(step.step, step.step_s);
      continue;
    }
    if (step.kind == RecordKind::kFromPeer) {  // in-process recovery: the state came from a peer
      ledger_.StateFromPeer(step.step, step.step_s);
      // The rank holds that step whole: its progress also where it reports no steps (the
      // rule "failed at the same step again after an in-process recovery" reads it).
      steps_.Holds(m.rank, step.step);
      continue;
    }
    if (step.kind != RecordKind::kStep) continue;  // kDeclared, kPause, ...: not a step
    ledger_.Step(step.step, step.step_s, clock_.Now());
    steps_.Add(m.rank, step);
  }
}

SteadyTime AgentTelemetry::Due() const { return options_.on ? next_publish_ : SteadyTime::max(); }

void AgentTelemetry::MaybePublish(bool now_anyway, bool all_steps) {
  if (!options_.on) return;
  const SteadyTime now = clock_.Now();
  if (!now_anyway && now < next_publish_) return;
  next_publish_ = now + options_.period;
  if (!sampler_ && !now_anyway && options_.sample_processes) {
    sampler_ = std::make_unique<ResourceSampler>(options_.period);
    WatchMembersAndSpares();
  }
  source_.Publish(NodeTelemetryNow(all_steps));
}

namespace {

void SetPercentiles(std::vector<double> v, telemetry::RankTelemetry* x) {
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

void AgentTelemetry::AddProcessFigures(const Member& w, const std::map<pid_t, ProcSample>& procs,
                                       telemetry::RankTelemetry* x) {
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

telemetry::NodeTelemetry AgentTelemetry::NodeTelemetryNow(bool all_steps) {
  telemetry::NodeTelemetry t;
  t.hostname = hostname_;
  t.restarts = ledger_.Costs();
  t.lost_s = ledger_.lost_s();
  t.productive_s = ledger_.productive_s();
  t.profiles = profiles_;
  {
    std::lock_guard<std::mutex> lock(stacks_mu_);
    t.stacks_json = stacks_json_;
  }
  t.program = options_.program;
  t.agent_cpu_s = AgentCpuSeconds();
  t.warm_spares = options_.warm_spares;
  if (options_.sample_processes) {
    static const MemoryAllowance memory = MemoryAllowanceOfThisMachine();  // read once
    static const CpuAllocation cpus = AllocatedCpus();
    t.memory_limit_bytes = memory.bytes;
    t.memory_limit_source = memory.source;
    t.cpus_allocated = cpus.cpus;
    t.cpus_source = cpus.source;
  }
  std::map<pid_t, ProcSample> procs;
  if (sampler_) {
    procs = sampler_->Latest();
    t.gpus = sampler_->Gpus();
  }
  int64_t spares = 0;  // the spares' memory now (a promoted one is a member, not counted)
  for (pid_t pid : spare_pids_) {
    if (auto p = procs.find(pid); p != procs.end()) spares += p->second.rss_bytes;
  }
  spare_rss_peak_bytes_ = std::max(spare_rss_peak_bytes_, spares);
  t.spare_rss_peak_bytes = spare_rss_peak_bytes_;
  std::map<int, const Member*> by_rank;
  for (const Member& m : members_) by_rank[m.rank] = &m;
  // Ranks with steps, and the current workers (a program that reports nothing still gets its
  // process figures).
  std::map<int, int> ranks;  // rank -> local rank
  for (const auto& [rank, r] : steps_.ranks()) {
    // A rank beyond the world size ran in an earlier, larger round (as the rendezvous drops it).
    if (world_size_ == 0 || rank < world_size_) ranks[rank] = rank - rank_offset_;
  }
  for (const auto& [rank, w] : by_rank) ranks[rank] = w->local_rank;
  for (const auto& [rank, local] : ranks) {
    telemetry::RankTelemetry x;
    x.rank = rank;
    x.local_rank = local;
    if (auto it = steps_.ranks().find(rank); it != steps_.ranks().end()) {
      const StepTally::RankSteps& r = it->second;
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
      SetPercentiles(StepTally::LatestStepTimes(r, all_steps ? StepTally::kMaxStepTimes : 1024),
                     &x);
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

// The report is the job's where this agent holds the job-wide aggregate (a single-node job, or
// the rendezvous host), else this node's. Printed when telemetry is on and any rank reported
// anything; written as JSON with --report-json.
void AgentTelemetry::Finish(int rc, double wall_s, const Assignment& last) {
  const SteadyTime now = clock_.Now();
  std::shared_ptr<telemetry::JobTelemetry> job = options_.on ? source_.job_telemetry() : nullptr;
  const bool whole = job != nullptr;
  if (!whole) {
    job = std::make_shared<telemetry::JobTelemetry>();
    job->SetJob(last.run_id, last.round, last.world_size, 1, last.restart_count);
    job->Update("local", hostname_, NodeTelemetryNow(/*all_steps=*/true), now);
  }
  job->SetState(rc == 0 ? "succeeded" : "failed");
  telemetry::JobTelemetry::Snapshot snap = job->TakeSnapshot(now);
  snap.wall_s = wall_s;
  if (!whole) snap.restarts = last.restart_count;
  // This node saw every round it ran in; a rendezvous host that took over saw only its own.
  snap.max_world_size = std::max(snap.max_world_size, max_world_size_);
  snap.max_nodes = std::max(snap.max_nodes, max_nodes_);
  // Over the whole job, CPU utilisation is CPU time over wall time (not the last sample).
  for (auto& [rank, r] : snap.ranks) {
    if (r.cpu_s > 0 && wall_s > 0) r.cpu_utilization = r.cpu_s / wall_s;
  }
  bool any = false;
  for (const auto& [rank, r] : snap.ranks) any |= r.steps > 0 || r.cpu_s > 0;
  if (options_.on && any) {
    std::string text = telemetry::FormatJobReport(snap, rc);
    if (!whole) text.replace(0, std::string("job report").size(), "job report (this node)");
    if (steps_.bad_records() > 0) {
      absl::StrAppend(&text, "\n  malformed step records dropped: ", steps_.bad_records());
    }
    spdlog::info("{}", text);
  }
  if (!options_.report_json.empty()) WriteJson(telemetry::SnapshotJson(snap, false), rc, whole);
  sampler_.reset();
}

void AgentTelemetry::WriteJson(const std::string& snapshot_json, int rc, bool whole) const {
  nlohmann::json j = nlohmann::json::parse(snapshot_json);
  j["exit_code"] = rc;
  j["bad_records"] = steps_.bad_records();
  j["scope"] = whole ? "job" : "node";
  j["failures"] = nlohmann::json::array();
  for (const Failure& f : failures_) {
    nlohmann::json jf{{"rank", f.rank}, {"host", f.host}, {"class", f.cls}, {"message", f.message}};
    if (f.stacks_json.valid()) {
      jf["stacks"] = nlohmann::json::parse(f.stacks_json.get(), nullptr, false);
    }
    if (f.faulting_frame.valid()) jf["faulting_frame"] = f.faulting_frame.get();
    if (!f.flight_recorder_json.empty()) {
      jf["flight_recorder"] = nlohmann::json::parse(f.flight_recorder_json, nullptr, false);
    }
    j["failures"].push_back(std::move(jf));
  }
  j["agent_cpu_s"] = AgentCpuSeconds();
  if (absl::Status s = fs_.Write(options_.report_json, j.dump(2) + "\n"); !s.ok()) {
    spdlog::error("cannot write the report to {}: {}", options_.report_json,
                  std::string(s.message()));
  } else {
    spdlog::info("report written to {}", options_.report_json);
  }
}

}  // namespace dlrun::launcher
