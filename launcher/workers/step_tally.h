// What each rank said in its step records ('S'), summed over the run, and the last step each
// holds in the current group (agent_telemetry.h publishes them; failure_policy and the recovery
// read LastStep). Single-threaded: the agent's loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "launcher/workers/step_record.h"

namespace dlrun::launcher {

class StepTally {
 public:
  // One rank's steps, summed over the run.
  struct RankSteps {
    int64_t steps = 0, samples = 0;
    double step_s = 0, data_s = 0, compute_s = 0, sync_s = 0;
    bool has_data = false, has_split = false;
    std::optional<double> loss;
    std::vector<double> step_times;  // the last kMaxStepTimes (a ring), for the percentiles
  };
  static constexpr size_t kMaxStepTimes = 10000;  // 80 KB per rank

  // A new group: no rank holds a step of it yet.
  void NewGroup() { last_step_.clear(); }
  // Rank `rank` finished a step (an 'S' record).
  void Add(int rank, const StepRecord& step);
  // Rank `rank` holds `step` whole without having reported it (the state from a peer).
  void Holds(int rank, int64_t step);
  // The last step `rank` reported in the current group, or -1 before its first record.
  int64_t LastStep(int rank) const;
  void BadRecord() { ++bad_records_; }
  int64_t bad_records() const { return bad_records_; }
  const std::map<int, RankSteps>& ranks() const { return ranks_; }
  // The latest `n` step times of `r`'s ring, in step order.
  static std::vector<double> LatestStepTimes(const RankSteps& r, size_t n);

 private:
  std::map<int, RankSteps> ranks_;
  std::map<int, int64_t> last_step_;  // per rank, in the current group
  int64_t bad_records_ = 0;
};

}  // namespace dlrun::launcher
