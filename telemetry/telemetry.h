// Job telemetry (docs/TELEMETRY.md): what every agent measures about its ranks, and
// the job-wide aggregate kept where the job is seen whole (the rendezvous host, or the agent of
// a single-node job). No gRPC, no protobuf, no LibTorch: the handler converts the heartbeat's
// NodeTelemetry message to these types, and the HTTP side (telemetry/metrics_http.cc) and the
// end-of-job report read JobTelemetry's snapshot.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/defaults.h"

namespace dlrun::telemetry {

// One rank as its agent sees it. The counters are cumulative over the whole job (every attempt),
// so a lost heartbeat loses nothing: the next one carries the totals.
struct RankTelemetry {
  int rank = 0;
  int local_rank = 0;
  std::string host;  // filled in by the aggregate from the node that sent it
  int64_t steps = 0, samples = 0;
  double step_s = 0, data_s = 0, compute_s = 0, sync_s = 0;  // sums over the steps
  bool has_data = false, has_split = false;  // data_s / compute_s+sync_s were reported
  double step_p50_s = 0, step_p95_s = 0;    // over the agent's last steps
  std::optional<double> loss;
  // From /proc, sampled by the agent: CPU cores busy over the last sampling period (1.0: one
  // core), CPU seconds so far (this attempt's process and the ones before), resident memory.
  std::optional<double> cpu_utilization;
  double cpu_s = 0;
  int64_t rss_bytes = 0, rss_peak_bytes = 0;
  int64_t gpu_memory_bytes = -1;  // this process on its GPU, through NVML; -1: unknown
};

struct GpuTelemetry {
  int index = 0;         // NVML index on its host
  std::string host;      // filled in by the aggregate
  double utilization = 0;  // 0..1 over NVML's last sample period
  int64_t memory_used_bytes = 0, memory_total_bytes = 0;
  // Filled in by the aggregate: over the updates while the job was stepping.
  std::optional<double> mean_utilization;
  int64_t peak_memory_used_bytes = 0;
};

// What one restart cost, by phase (docs/TELEMETRY.md, "Time lost to restarts"): from the end
// of the last step finished before the fault to the start of the first step past it. The
// phases are consecutive, so they sum to that span.
struct RestartCost {
  int restart = -1;   // the restart count of the group that ran again (-1: none ran yet)
  int restarts = 1;   // the restarts in the span (a fault during the recovery adds one)
  std::string host;   // the node that measured it (filled in by the aggregate)
  double detection_s = 0;  // last step's end -> the fault seen (the unfinished step, the noticing)
  double stop_s = 0;       // stopping the workers (capture before kill included)
  double rendezvous_s = 0;  // -> the new assignment
  double start_s = 0;       // -> the first step begins (process start, init), less the load
  double checkpoint_load_s = 0;
  double state_from_peer_s = 0;  // in-process recovery: the state transfer from a survivor
  double recomputed_s = 0;  // steps done before the fault, computed again
  int64_t recomputed_steps = 0;
  int64_t fault_step = -1;    // the highest step finished before the fault
  int64_t resumed_step = -1;  // the checkpoint's step the workers reported (-1: none)
  bool resumed = false;       // a step past fault_step began (else the figures are so far)
  bool in_process = false;    // the survivors kept running (in-process recovery)
  bool admission = false;     // not a fault: a node joined the running group (in process)
  int generation = 0;         // in process: the group generation it began (0: a restart)
  // In-process recoveries begun in the span that did not finish (the restart came after
  // them): counted in `restarts`, which counts the span's faults, but restarted nothing.
  int in_process_tries = 0;
  // How the span's last group's new processes started (the replacement in process, every worker
  // after a restart): forked from the fork server, promoted warm spares, cold (their own start).
  int started_forked = 0, started_spare = 0, started_cold = 0;
  // The cause this node's agent gave (a failure of its own ranks); empty: another node's, or
  // none. A node's own report names it where the job's list of causes is not at hand.
  std::string cause;
  // The span's in-process recoveries (each begun, finished or not) and its group restarts.
  int recoveries() const { return in_process ? restarts : in_process_tries; }
  int group_restarts() const { return in_process ? 0 : restarts - in_process_tries; }
  // The phases in order, with their names ("detection", ..., "recomputed"): the report's JSON
  // keys are the name + "_s", /metrics' labels the name.
  std::array<std::pair<const char*, double>, 7> Phases() const {
    return {{{"detection", detection_s},
             {"stop", stop_s},
             {"rendezvous", rendezvous_s},
             {"start", start_s},
             {"checkpoint_load", checkpoint_load_s},
             {"state_from_peer", state_from_peer_s},
             {"recomputed", recomputed_s}}};
  }
  double total_s() const {
    double sum = 0;
    for (const auto& [name, s] : Phases()) sum += s;
    return sum;
  }
  // Adds `b` (its restarts, phases and recomputed steps): a sum over restarts.
  void Add(const RestartCost& b);
};
// The sum of `costs` (restarts counted from 0).
RestartCost SumOfRestartCosts(const std::vector<RestartCost>& costs);
inline constexpr size_t kMaxRestartCosts = 64;  // per node; older ones are folded into one

// One profiled rank's capture (docs/PROFILING.md): where its file is (on `host`) and the frames
// it spent most samples in (perf and py-spy captures).
struct RankProfile {
  int rank = 0;
  std::string host;  // filled in by the aggregate
  std::string tool;  // nsys, py-spy, perf, torch
  std::string path;  // the flame graph (perf, py-spy), report (nsys) or trace (torch)
  std::vector<std::pair<std::string, double>> hot;  // frame, share of the samples; largest first
  std::string note;  // why there is no file, or what is odd about it; empty when all went well
  int64_t samples = 0;  // the samples `hot`'s shares are of (0: not known)
};
// Under this many samples a share is said to be rough (4 samples give 25% steps).
inline constexpr int64_t kProfileFewSamples = 50;
inline constexpr size_t kMaxProfileHotFrames = 8;
inline constexpr size_t kMaxTelemetryProgramBytes = 256;

// What one agent sends with each heartbeat (and its leave): bounded, about 120 bytes a rank.
struct NodeTelemetry {
  std::vector<RankTelemetry> ranks;
  std::vector<GpuTelemetry> gpus;
  double lost_s = 0;  // this node's time lost to restarts so far (the sum of `restarts`)
  std::vector<RestartCost> restarts;  // at most kMaxRestartCosts
  double productive_s = 0;  // time in steps that were kept (no recomputation), one rank's
  std::string hostname;
  int64_t memory_limit_bytes = 0;  // what the node's workers may use (cgroup limit or RAM); 0: ?
  std::string memory_limit_source;  // "Slurm --mem", "cgroup limit", "machine memory"
  // The CPUs the node's workers may use (common/cpus.h: affinity, cgroup quota, Slurm's
  // cpus-per-task) and which bound it; 0: unknown.
  double cpus_allocated = 0;
  std::string cpus_source;
  // The workers' program as the advice names it: the executable's base name ("train_unet"),
  // or the Python script's ("train.py"); empty: unknown.
  std::string program;
  double agent_cpu_s = 0;  // the node's agent's own CPU time so far: dlrun's cost there
  bool warm_spares = false;  // a warm spare stands by each worker (--spare-workers)
  int64_t spare_rss_peak_bytes = 0;  // the warm spares' resident memory, summed, at its peak
  // The node's last capture before kill, summarised (docs/STACKS.md): JSON, at most
  // kMaxTelemetryStacksBytes; empty: none yet. The page and /api/job show the job's latest.
  std::string stacks_json;
  std::vector<RankProfile> profiles;  // this node's profiled ranks whose captures are done
};

// Bounds the handler enforces on a NodeTelemetry message.
inline constexpr size_t kMaxTelemetryRanks = 1024;
inline constexpr size_t kMaxTelemetryGpus = 64;
inline constexpr size_t kMaxTelemetryStacksBytes = 16 * 1024;

struct TelemetryOptions {
  std::chrono::milliseconds window = defaults::kTelemetryWindow;  // straggler windows, chart points
  double straggler_factor = defaults::kStragglerFactor;
  int straggler_windows = defaults::kStragglerWindows;  // consecutive windows above the factor
  size_t history = 600;       // chart points kept (10 minutes at 1 s)
  // Called once when a rank is first named a straggler, with the warning line.
  std::function<void(const std::string&)> on_straggler;
};

struct Straggler {
  int rank = 0;
  std::string host;
  double busy_s = 0, median_busy_s = 0;  // compute + data wait per step, in its last window
  double sync_s = -1, median_sync_s = -1;  // waiting in the gradient sync per step (-1: n/a)
  std::string metric;  // "compute" (the split was reported) or "cpu" (CPU utilisation)
  std::string hint;    // CPU-bound, waiting for data, GPU idle, stalled
  int64_t window = 0;  // the window it was named in
  bool active = true;  // still above the factor in the latest window
};

// One chart point: the job over one window.
struct HistoryPoint {
  double t = 0;  // seconds since the aggregate started
  double step_time_s = 0;      // median over ranks of their mean step time in the window
  double step_time_max_s = 0;  // the slowest rank's
  double samples_per_sec = 0;  // all ranks together
  int restarts = 0;            // restart count at that time (a change is a restart marker)
};

// The job-wide view. Thread-safe: heartbeats update it, HTTP requests and the report read it.
class JobTelemetry {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  explicit JobTelemetry(TelemetryOptions options = {});

  // The latest figures from one node (replaces what it sent before; ranks it no longer has
  // stay with their last figures). Closes the windows that `now` has passed.
  void Update(const std::string& node_id, const std::string& hostname, NodeTelemetry t,
              TimePoint now);
  // The job's shape and its restarts (from the rendezvous or the single-node agent).
  void SetJob(const std::string& run_id, uint64_t round, int world_size, int nodes,
              int restarts);
  void AddRestartCause(const std::string& cause);
  void SetState(const std::string& state);  // "running", "restarting", "succeeded", "failed"

  struct Snapshot {
    std::string run_id, state;
    uint64_t round = 0;
    int world_size = 0, nodes = 0, restarts = 0;
    std::vector<std::string> restart_causes;
    double wall_s = 0, lost_s = 0;
    // Every restart's cost (the node that lost most to each), and the time in kept steps.
    std::vector<RestartCost> restart_costs;
    double productive_s = 0;
    int max_world_size = 0, max_nodes = 0;  // the largest round (the shape may have shrunk)
    int64_t windows = 0;
    int64_t first_step_window = -1;  // the window the first steps were seen in
    std::map<int, RankTelemetry> ranks;
    std::vector<GpuTelemetry> gpus;
    struct NodeMemory {
      std::string host;
      int64_t peak_rss_bytes = 0;  // its ranks' peaks summed
      int64_t spare_rss_bytes = 0;  // its warm spares' (beside the ranks, not in the peak)
      int64_t limit_bytes = 0;
      std::string limit_source;
      double cpus = 0;  // allocated to its workers (0: unknown)
      std::string cpus_source;
      int ranks = 0;    // its ranks in the snapshot
      double cpu_s = 0;  // their CPU seconds
    };
    std::vector<NodeMemory> node_memory;
    std::vector<Straggler> stragglers;  // every rank ever named; `active` says if it still is
    std::vector<HistoryPoint> history;
    double samples_per_sec = 0;  // over the job: samples / the slowest rank's step time sum
    std::string stacks_json;     // the latest capture before kill of any node, or empty
    std::map<int, RankProfile> profiles;  // by rank
    std::string program;  // the workers' program (the first node's that said)
    double agent_cpu_s = 0;  // every node's agent's CPU time, summed
    bool warm_spares = false;  // every node that said anything keeps warm spares
  };
  Snapshot TakeSnapshot(TimePoint now) const;

 private:
  struct Window {
    int64_t steps = 0, samples = 0;
    double step_s = 0, busy_s = 0, sync_s = 0;  // at the window's start (cumulative)
  };
  void CloseWindows(TimePoint now);  // mu_ held
  void UpdateStragglers(const std::map<int, Window>& deltas);  // mu_ held

  TelemetryOptions options_;
  const TimePoint start_;
  mutable std::mutex mu_;
  std::string run_id_, state_ = "starting";
  uint64_t round_ = 0;
  int world_size_ = 0, nodes_ = 0, restarts_ = 0;
  int max_world_size_ = 0, max_nodes_ = 0;
  std::vector<std::string> causes_;
  std::map<std::string, NodeTelemetry> nodes_seen_;  // by node id
  std::string stacks_json_;  // the latest capture any node sent (a node sends its own each time)
  std::map<int, RankProfile> profiles_;  // by rank, as the nodes last sent them
  std::map<int, RankTelemetry> ranks_;
  std::map<int, Window> window_start_;  // per rank: the counters when the window opened
  std::map<int, int> streak_;           // consecutive windows above the factor
  std::map<int, Straggler> stragglers_;
  struct GpuAcc {
    double sum = 0;
    int64_t n = 0, peak = 0;
  };
  std::map<std::pair<std::string, int>, GpuAcc> gpu_acc_;  // by (host, index)
  std::deque<HistoryPoint> history_;
  TimePoint next_window_;
  int64_t windows_ = 0;
  int64_t first_step_window_ = -1;
};

// Median of `v` (the mean of the two middle values for an even count); 0 when empty.
double Median(std::vector<double> v);

// The snapshot as JSON (`/api/job`, and with `with_history` false the end-of-job report).
std::string SnapshotJson(const JobTelemetry::Snapshot& s, bool with_history);

// The end-of-job report (like seff, for a training job): a few lines, with advice.
std::string FormatJobReport(const JobTelemetry::Snapshot& s, int exit_code);

}  // namespace dlrun::telemetry
