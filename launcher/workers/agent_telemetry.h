// This node's telemetry (docs/TELEMETRY.md): what the workers say in step records, what the
// resource sampler reads of their processes, published through the membership source every
// period; the metrics server once this node holds the job-wide aggregate; and the end-of-job
// report. The agent (agent.h) tells it which processes run which ranks, hands it the step
// records it reads, and asks it when the next publication is due. It reads the time only through
// the agent's Clock, so the agent's in-process tests drive it on the fake one.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/assignment.h"
#include "common/defaults.h"
#include "launcher/base/file_system.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/job_channel.h"
#include "launcher/workers/processes.h"
#include "launcher/workers/resource_sampler.h"
#include "launcher/workers/restart_ledger.h"
#include "launcher/workers/step_record.h"
#include "launcher/workers/step_tally.h"

namespace dlrun::launcher {

struct TelemetryOptions {
  // Off (--telemetry off): nothing is published, sampled or reported (--report-json still
  // writes the exit code).
  bool on = true;
  Millis period = defaults::kTelemetryWindow;  // between publications and sampler reads
  bool sample_processes = true;  // the /proc + NVML sampler (in-process tests with fake pids: off)
  // The workers' program's base name (the report's advice names train_unet's own flags).
  std::string program;
  bool warm_spares = false;  // a warm spare stands by each worker
  // --report-json: this node's end-of-job report as JSON; empty: none.
  std::string report_json;
  // --metrics-port: serves the job-wide aggregate over HTTP once this node holds it (a
  // single-node job, or the rendezvous host); the result keeps the server alive.
  std::function<std::shared_ptr<void>(std::shared_ptr<telemetry::JobTelemetry>)> serve_metrics;
};

class AgentTelemetry {
 public:
  // One worker of the current group.
  struct Member {
    int rank = 0;  // global
    int local_rank = 0;
    pid_t pid = -1;
    bool alive = true;
    StartKind start = StartKind::kUnknown;  // how its process started (Processes::HowStarted)
  };

  // --report-json is written through `fs`.
  AgentTelemetry(TelemetryOptions options, std::string hostname, JobChannel& source, Clock& clock,
                 FileSystem& fs);
  ~AgentTelemetry();

  // The run starts. The first publication, and with it the sampler, come a period in: a job
  // shorter than that (a launch benchmark, a failed start) pays nothing for them.
  void Start();
  // A new worker group runs: the earlier group's CPU time stays counted, the sampler watches the
  // new processes, and the metrics server starts once the source holds the job's aggregate.
  // `group`: its assignment, which arrived at `assigned_at`; its workers run from now on.
  void GroupStarted(std::vector<Member> members, const Assignment& group, SteadyTime assigned_at);
  // The agent saw a fault (the restart ledger's span opens, restart_ledger.h), or finished
  // stopping the workers after one.
  void FaultSeen(SteadyTime t, bool admission = false) { ledger_.FaultSeen(t, admission); }
  // In-process recovery: the group goes on as `members` (the lost ranks' new pids, the others
  // the same processes) from `t`, without a stop or a rendezvous.
  void Replaced(std::vector<Member> members, const Assignment& group, SteadyTime t, int generation);
  void Stopped(SteadyTime t) { ledger_.Stopped(t); }
  void RecoveryDone(SteadyTime t) { ledger_.RecoveryDone(t); }
  // A worker exited; `cpu_s` (>= 0 when known) is its whole CPU time with its reaped children's,
  // `rss_peak_bytes` (> 0 when known) its peak resident memory: a floor under the sampler's.
  void Exited(pid_t pid, double cpu_s = -1, int64_t rss_peak_bytes = 0);
  void Step(pid_t pid, const StepRecord& step);
  void SetWarmSpares(bool on) { options_.warm_spares = on; }
  // The warm spares standing by now: sampled beside the workers, reported apart from them.
  void SetSpares(std::vector<pid_t> pids);
  // A failed attempt's root cause, for --report-json's "failures" (root_cause.h's class names).
  struct Failure {
    int rank = 0;
    std::string host, cls, message;
    // The capture before kill (stacks.h StackReportJson), named in the background: read when
    // the report is written. Invalid: none.
    std::shared_future<std::string> stacks_json;
    // Where the ranks' Flight Recorder dumps first disagree (flight_recorder.h FrVerdictJson),
    // or empty.
    std::string flight_recorder_json;
    // A crash's faulting frame ("file:line function"), from the stack the worker wrote as it
    // died (crash_trace.h), named in the background where it is native; invalid: none.
    std::shared_future<std::string> faulting_frame;
    // What this agent told the rendezvous the restart is for (the node's report says it).
    std::string cause;
  };
  void NoteFailure(Failure f) {
    if (!f.cause.empty()) ledger_.Cause(f.cause);
    failures_.push_back(std::move(f));
  }
  // The last capture before kill, summarised (stacks.h StackSummaryJson): sent with every
  // publication from now on. Thread-safe (the capture is kept on a thread of its own).
  void SetStacks(std::string summary_json) {
    std::lock_guard<std::mutex> lock(stacks_mu_);
    stacks_json_ = std::move(summary_json);
  }
  // The profiled ranks' results so far (profiler.h), sent with every publication from now on.
  void SetProfiles(std::vector<telemetry::RankProfile> p) { profiles_ = std::move(p); }
  // What the ranks said in their step records: LastStep(rank), BadRecord().
  StepTally& steps() { return steps_; }

  // What the hang watch reads of the sampler's last period: each current worker's CPU use, in
  // cores (with its children; empty before the sampler's first reads, or without the sampler),
  // and the workers busy off the CPU: they read from storage over the period (page faults,
  // reads), or their main thread was runnable without using a CPU (waiting for one) or in
  // uninterruptible I/O at the read.
  struct CpuUse {
    std::map<pid_t, std::optional<double>> cores;
    std::set<pid_t> busy_off_cpu;
  };
  CpuUse Cpu() const {
    CpuUse out;
    if (!sampler_) return out;
    for (const auto& [pid, s] : sampler_->Latest()) {
      out.cores[pid] = s.cpu_utilization;
      if (s.read_storage || s.state == 'R' || s.state == 'D') out.busy_off_cpu.insert(pid);
    }
    return out;
  }

  // The busiest GPU's utilisation (0..1) in the sampler's last read; 0 without GPUs.
  double GpuUtilizationMax() const {
    double m = 0;
    if (sampler_) {
      for (const telemetry::GpuTelemetry& g : sampler_->Gpus()) m = std::max(m, g.utilization);
    }
    return m;
  }

  // When the next publication is due (never, with telemetry off).
  SteadyTime Due() const;
  // Publishes this node's figures when the period has passed, or now with `now_anyway`;
  // `all_steps`: percentiles over every step the ring holds (the final figures), else the latest.
  void MaybePublish(bool now_anyway = false, bool all_steps = false);
  // The job ended with `rc` after `wall_s`: prints the report (the job's where this node holds
  // the aggregate, else this node's), writes --report-json, and stops the sampler.
  void Finish(int rc, double wall_s, const Assignment& last);

 private:
  telemetry::NodeTelemetry NodeTelemetryNow(bool all_steps);
  // A current worker's sampled CPU, memory and GPU memory into `x` (kept across its samples).
  void AddProcessFigures(const Member& m, const std::map<pid_t, ProcSample>& procs,
                         telemetry::RankTelemetry* x);
  void WriteJson(const std::string& snapshot_json, int rc, bool whole) const;

  TelemetryOptions options_;
  std::string hostname_;
  JobChannel& source_;
  FileSystem& fs_;
  Clock& clock_;
  std::vector<Member> members_;
  std::vector<pid_t> spare_pids_;     // SetSpares
  int64_t spare_rss_peak_bytes_ = 0;  // their summed resident memory, at its peak
  void WatchMembersAndSpares();       // the sampler's pids: the members and the spares
  int rank_offset_ = 0;
  StepTally steps_;
  std::mutex stacks_mu_;
  std::string stacks_json_;  // guarded by stacks_mu_
  std::vector<Failure> failures_;
  std::vector<telemetry::RankProfile> profiles_;
  std::unique_ptr<ResourceSampler> sampler_;
  SteadyTime next_publish_{};
  RestartLedger ledger_;
  int world_size_ = 0;                      // the current group's
  int max_world_size_ = 0, max_nodes_ = 0;  // over the groups this node ran
  std::map<int, double> cpu_base_;          // per rank: CPU seconds of its earlier processes
  std::map<pid_t, double> cpu_seen_;        // per worker pid: its latest CPU seconds
  std::map<int, ProcSample> proc_last_;     // per rank: its process' last sample
  std::shared_ptr<void> metrics_;           // the HTTP server, once started
};

}  // namespace dlrun::launcher
