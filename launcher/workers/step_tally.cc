#include "launcher/workers/step_tally.h"

#include <algorithm>

namespace dlrun::launcher {

void StepTally::Add(int rank, const StepRecord& step) {
  RankSteps& r = ranks_[rank];
  last_step_[rank] = step.step;
  ++r.steps;
  r.samples += step.samples;
  r.step_s += step.step_s;
  if (step.data_s) {
    r.data_s += *step.data_s;
    r.has_data = true;
  }
  if (step.compute_s && step.sync_s) {
    r.compute_s += *step.compute_s;
    r.sync_s += *step.sync_s;
    r.has_split = true;
  }
  if (step.loss) r.loss = step.loss;
  if (r.step_times.size() < kMaxStepTimes) {
    r.step_times.push_back(step.step_s);
  } else {
    r.step_times[static_cast<size_t>(r.steps - 1) % kMaxStepTimes] = step.step_s;
  }
}

void StepTally::Holds(int rank, int64_t step) { last_step_[rank] = std::max(LastStep(rank), step); }

int64_t StepTally::LastStep(int rank) const {
  auto it = last_step_.find(rank);
  return it == last_step_.end() ? -1 : it->second;
}

// Kept in step order up to kMaxStepTimes, then overwritten at steps % kMaxStepTimes.
std::vector<double> StepTally::LatestStepTimes(const RankSteps& r, size_t n) {
  constexpr size_t kMax = kMaxStepTimes;
  const std::vector<double>& ring = r.step_times;
  n = std::min(n, ring.size());
  if (ring.size() < kMax) return {ring.end() - static_cast<std::ptrdiff_t>(n), ring.end()};
  const size_t end = static_cast<size_t>(r.steps) % kMax;  // one past the latest
  std::vector<double> v;
  v.reserve(n);
  for (size_t k = 0; k < n; ++k) v.push_back(ring[(end + kMax - n + k) % kMax]);
  return v;
}

}  // namespace dlrun::launcher
