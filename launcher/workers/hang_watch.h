// Hang detection (docs/USAGE.md, "Hangs"), on by default: what the agent learns from each
// worker's heartbeats, step records and CPU use, and when a worker or the whole group counts
// as hung. Pure bookkeeping on the agent's clock: the agent feeds it and acts on its answers
// (a stack dump to name the culprit, then the ordinary restart), so it is unit-tested with the
// fake clock (tests/launcher/agent/hang_test.cc).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/defaults.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/step_record.h"

namespace dlrun::launcher {

struct HangOptions {
  bool on = true;  // --hang-detect: off leaves only --hang-timeout's heartbeat rule
  // --hang-timeout: a worker that heartbeat and then fell silent this long is hung; a group that
  // never heartbeats is hung when idle this long. Zero: not given.
  Millis timeout{0};
  double step_factor = defaults::kHangStepFactor;
  Millis step_floor = defaults::kHangStepFloor;  // --hang-floor
  int min_steps = defaults::kHangMinSteps;
  double idle_cores = defaults::kHangIdleCores;
  double idle_gpu = defaults::kHangIdleGpu;  // utilisation, 0..1
  Millis idle_bound = defaults::kHangIdleBound;
};

class HangWatch {
 public:
  explicit HangWatch(HangOptions options) : options_(options) {}

  // A new group of `pids` runs from `now`; Add: one worker (a replacement) joins it.
  void Start(const std::vector<pid_t>& pids, SteadyTime now);
  void Add(pid_t pid);
  void Exited(pid_t pid);
  // Any byte on a worker's heartbeat pipe; a record ('S' steps, 'Z'/'z' pauses, 'D' done).
  void Beat(pid_t pid, SteadyTime now);
  void Record(pid_t pid, const StepRecord& r, SteadyTime now);
  // The workers' CPU use over the last sampling period, in cores (absent: not sampled yet), the
  // busiest GPU's utilisation (0..1; 0 without GPUs): a GPU at work is no idle group, and the
  // workers busy off the CPU (reading from storage, waiting for a CPU): a cold start paging
  // LibTorch in from a slow disk, or a crowded machine, is no idle group either.
  void Cpu(const std::map<pid_t, std::optional<double>>& cores, SteadyTime now,
           double gpu_utilization = 0, const std::set<pid_t>& busy_off_cpu = {});

  struct Hung {
    pid_t pid = -1;
    std::string why;  // "no step record for 61.0 s (bound 60 s: 20 x its p99 gap of 0.21 s, ...)"
  };
  // A worker that is hung now, by its step records or --hang-timeout's heartbeat rule; `next`
  // gets when the next one could be.
  std::optional<Hung> Check(SteadyTime now, SteadyTime* next) const;

  // How long every live worker has been idle (none paused), or nullopt while one is busy or
  // not yet sampled.
  std::optional<Millis> IdleFor(SteadyTime now) const;
  // Whether the idle spell in progress reached the bound that makes it worth a line (once per
  // spell: MarkIdleReported), and whether it is a hang by --hang-timeout.
  bool IdleWorthALine(SteadyTime now) const;
  bool IdleIsHang(SteadyTime now) const;
  void MarkIdleReported() { idle_reported_ = true; }
  // --hang-timeout given, and no worker has sent a byte for that long since the group
  // started: true once, for the line that says what the flag does then.
  bool TimeoutNeverArmed(SteadyTime now);

 private:
  struct Worker {
    bool beat = false;
    SteadyTime last_beat{}, last_record{};
    int64_t records = 0;
    std::vector<double> gaps;  // seconds between step records, the last kMaxGaps (a ring)
    size_t next_gap = 0;
    std::optional<std::string> paused;  // what, while a pause is declared
    bool done = false;  // its work is done ('D', dlrun_report.done()): its teardown is no hang
    bool sampled = false;
    bool busy = true;
    std::optional<SteadyTime> due;  // when it is hung by its step records
    double p99 = 0;                 // of `gaps`, seconds
  };
  static constexpr size_t kMaxGaps = 1000;
  void Recompute(Worker& w) const;

  HangOptions options_;
  std::map<pid_t, Worker> workers_;
  SteadyTime started_{};
  std::optional<SteadyTime> idle_since_;
  bool idle_reported_ = false;
  bool never_armed_said_ = false;
};

}  // namespace dlrun::launcher
