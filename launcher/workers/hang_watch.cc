#include "launcher/workers/hang_watch.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace dlrun::launcher {
namespace {

double Seconds(SteadyTime::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void HangWatch::Start(const std::vector<pid_t>& pids, SteadyTime now) {
  workers_.clear();
  started_ = now;
  idle_since_.reset();
  idle_reported_ = false;
  for (pid_t p : pids) workers_[p] = Worker{};
}

void HangWatch::Add(pid_t pid) {
  workers_[pid] = Worker{};
  idle_since_.reset();  // a replacement starts busy
  idle_reported_ = false;
}

void HangWatch::Exited(pid_t pid) { workers_.erase(pid); }

void HangWatch::Beat(pid_t pid, SteadyTime now) {
  auto it = workers_.find(pid);
  if (it == workers_.end()) return;
  it->second.beat = true;
  it->second.last_beat = now;
}

void HangWatch::Recompute(Worker& w) const {
  w.due.reset();
  if (!options_.on || w.paused || w.done || w.records <= options_.min_steps || w.gaps.empty()) {
    return;
  }
  std::vector<double> g = w.gaps;
  const size_t k = std::min(g.size() - 1, static_cast<size_t>(0.99 * g.size()));
  std::nth_element(g.begin(), g.begin() + static_cast<long>(k), g.end());
  w.p99 = g[k];
  const double bound = std::max(options_.step_factor * w.p99, Seconds(options_.step_floor));
  w.due = w.last_record +
          std::chrono::duration_cast<SteadyTime::duration>(std::chrono::duration<double>(bound));
}

void HangWatch::Record(pid_t pid, const StepRecord& r, SteadyTime now) {
  auto it = workers_.find(pid);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  if (r.kind == RecordKind::kPause) {
    w.paused = r.what;
  } else if (r.kind == RecordKind::kUnpause) {
    w.paused.reset();
    w.last_record = now;  // the time paused is no gap
  } else if (r.kind == RecordKind::kDone) {
    w.done = true;  // the interpreter's teardown may take seconds on a busy node
  } else if (r.kind == RecordKind::kStep) {
    if (w.records > 0 && !w.paused) {
      const double gap = Seconds(now - w.last_record);
      if (w.gaps.size() < kMaxGaps) {
        w.gaps.push_back(gap);
      } else {
        w.gaps[w.next_gap] = gap;
        w.next_gap = (w.next_gap + 1) % kMaxGaps;
      }
    }
    ++w.records;
    w.last_record = now;
  } else {
    return;
  }
  Recompute(w);
}

std::optional<HangWatch::Hung> HangWatch::Check(SteadyTime now, SteadyTime* next) const {
  *next = SteadyTime::max();
  std::optional<Hung> hung;
  for (const auto& [pid, w] : workers_) {
    if (w.due) {
      if (*w.due <= now && !hung) {
        hung =
            Hung{pid, absl::StrFormat("no step record for %.1f s (bound %.3g s: %g x its p99 "
                                      "gap of %.3g s, at least --hang-floor %g s)",
                                      Seconds(now - w.last_record), Seconds(*w.due - w.last_record),
                                      options_.step_factor, w.p99, Seconds(options_.step_floor))};
      }
      *next = std::min(*next, *w.due);
    }
    if (options_.timeout.count() > 0 && w.beat && !w.paused) {
      const SteadyTime due = w.last_beat + options_.timeout;
      if (due <= now && !hung) {
        hung = Hung{pid, absl::StrFormat("no heartbeat for %.1f s (--hang-timeout %g s)",
                                         Seconds(now - w.last_beat), Seconds(options_.timeout))};
      }
      *next = std::min(*next, due);
    }
  }
  return hung;
}

void HangWatch::Cpu(const std::map<pid_t, std::optional<double>>& cores, SteadyTime now,
                    double gpu_utilization, const std::set<pid_t>& busy_off_cpu) {
  bool all_idle = !workers_.empty() && gpu_utilization < options_.idle_gpu;
  for (auto& [pid, w] : workers_) {
    auto it = cores.find(pid);
    if (it != cores.end() && it->second) {
      w.sampled = true;
      w.busy = *it->second >= options_.idle_cores || busy_off_cpu.count(pid) > 0;
    }
    if (!w.sampled || w.busy || w.paused) all_idle = false;
  }
  if (!all_idle) {
    idle_since_.reset();
    idle_reported_ = false;
  } else if (!idle_since_) {
    idle_since_ = now;
  }
}

std::optional<Millis> HangWatch::IdleFor(SteadyTime now) const {
  if (!idle_since_) return std::nullopt;
  return std::chrono::duration_cast<Millis>(now - *idle_since_);
}

bool HangWatch::IdleWorthALine(SteadyTime now) const {
  if (idle_reported_) return false;
  const std::optional<Millis> idle = IdleFor(now);
  if (!idle) return false;
  return (options_.on && *idle >= options_.idle_bound) || IdleIsHang(now);
}

bool HangWatch::IdleIsHang(SteadyTime now) const {
  if (options_.timeout.count() == 0) return false;
  const std::optional<Millis> idle = IdleFor(now);
  return idle && *idle >= options_.timeout;
}

bool HangWatch::TimeoutNeverArmed(SteadyTime now) {
  if (never_armed_said_ || options_.timeout.count() == 0 || workers_.empty()) return false;
  if (now - started_ < options_.timeout) return false;
  for (const auto& [pid, w] : workers_) {
    if (w.beat) return false;
  }
  never_armed_said_ = true;
  return true;
}

}  // namespace dlrun::launcher
