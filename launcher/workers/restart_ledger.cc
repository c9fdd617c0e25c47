#include "launcher/workers/restart_ledger.h"

#include <algorithm>
#include <chrono>

namespace dlrun::launcher {
namespace {

double Secs(SteadyTime from, SteadyTime to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

SteadyTime Minus(SteadyTime t, double s) {
  return t - std::chrono::duration_cast<SteadyTime::duration>(std::chrono::duration<double>(s));
}

}  // namespace

void RestartLedger::FaultSeen(SteadyTime t, bool admission) {
  if (!open_) {
    open_.emplace();
    open_->cost.admission = admission;
    // No step finished in this group: the fault is all there is to go by.
    const SteadyTime begin = last_end_ ? std::min(*last_end_, t) : t;
    open_->cost.detection_s = Secs(begin, t);
    open_->cost.fault_step = high_step_;
  } else {
    open_->cost.admission = open_->cost.admission && admission;  // a fault meanwhile: a fault
    // A fault while an in-process group (generation > 0) ran: that recovery did not finish.
    if (open_->in_group && open_->cost.generation > 0) ++open_->cost.in_process_tries;
    ++open_->cost.restarts;
    CloseGroup(t);
  }
  open_->mark = t;
  open_->in_group = false;
}

void RestartLedger::CloseGroup(SteadyTime t) {
  OpenRestart& o = *open_;
  if (!o.in_group) return;
  // The failed group's time: its start (less its load) up to its first step, then recomputing.
  const SteadyTime first = o.first_begin ? std::clamp(*o.first_begin, o.mark, t) : t;
  const double before_first = Secs(o.mark, first);
  const double peer_s = o.peer_s.value_or(0);
  o.cost.start_s += std::max(0.0, before_first - o.load_s - peer_s);
  o.cost.checkpoint_load_s += std::min(o.load_s, before_first);
  o.cost.state_from_peer_s += std::min(peer_s, std::max(0.0, before_first - o.load_s));
  o.cost.recomputed_s += Secs(first, t);
  o.in_group = false;
}

void RestartLedger::Stopped(SteadyTime t) {
  if (!open_ || open_->in_group) return;
  open_->cost.stop_s += Secs(open_->mark, t);
  open_->mark = std::max(open_->mark, t);
}

void RestartLedger::GroupStarted(int restart, SteadyTime assigned, SteadyTime running,
                                 int generation) {
  last_end_.reset();
  counted_step_ = -1;
  if (!open_) return;
  OpenRestart& o = *open_;
  o.cost.rendezvous_s += Secs(o.mark, assigned);
  o.mark = std::max(o.mark, assigned);
  o.cost.restart = restart;
  o.cost.generation = generation;
  // A restart after an in-process group whose state had arrived: the span is the restart's
  // (its line, its figures); that recovery is counted in in_process_tries (FaultSeen).
  if (generation == 0) o.cost.in_process = false;
  o.in_group = true;
  o.first_begin.reset();
  o.load_s = 0;
  o.peer_s.reset();
  o.running = running;
}

void RestartLedger::Cause(const std::string& cause) {
  if (open_ && open_->cost.cause.empty()) open_->cost.cause = cause;
}

void RestartLedger::Resumed(int64_t step, double load_s) {
  if (!open_ || !open_->in_group) return;
  open_->cost.resumed_step = step;
  open_->load_s = std::max(open_->load_s, load_s);  // the ranks load side by side
}

void RestartLedger::StartedAs(int forked, int spare, int cold) {
  if (!open_ || !open_->in_group) return;
  open_->cost.started_forked = forked;  // the span's last group: the start it is booked with
  open_->cost.started_spare = spare;
  open_->cost.started_cold = cold;
}

void RestartLedger::StateFromPeer(int64_t step, double s) {
  if (!open_ || !open_->in_group) return;
  open_->cost.resumed_step = step;
  open_->cost.in_process = true;
  // The transfer itself is the fastest rank's figure: a survivor's includes its wait for the
  // replacement's start (its process and its program up to the transfer), which is "start".
  open_->peer_s = std::min(open_->peer_s.value_or(s), s);
}

void RestartLedger::RecoveryDone(SteadyTime t) {
  if (!open_ || !open_->in_group || high_step_ >= 0) return;
  OpenRestart& o = *open_;
  CloseGroup(t);  // no step began: start and state transfer run to the recovery's end
  o.cost.in_process = true;
  o.cost.resumed = true;
  Close();
}

void RestartLedger::Close() {
  closed_.push_back(open_->cost);
  open_.reset();
  if (closed_.size() > telemetry::kMaxRestartCosts) {
    closed_[1].Add(closed_[0]);  // the oldest, folded into the next
    closed_.erase(closed_.begin());
  }
}

void RestartLedger::Step(int64_t step, double step_s, SteadyTime now) {
  const SteadyTime begin = Minus(now, step_s);
  last_end_ = last_end_ ? std::max(*last_end_, now) : now;
  const bool first_of_step = step > counted_step_;  // each local rank reports every step
  counted_step_ = std::max(counted_step_, step);
  high_step_ = std::max(high_step_, step);
  if (open_ && open_->in_group) {
    OpenRestart& o = *open_;
    if (!o.first_begin) o.first_begin = begin;
    if (step <= o.cost.fault_step) {
      if (first_of_step) ++o.cost.recomputed_steps;
      return;  // done before the fault: not productive, it is in recomputed_s
    }
    // Past the fault's step: the job makes progress again, the span ends where this step began.
    CloseGroup(std::max(begin, *o.first_begin));
    o.cost.resumed = true;
    Close();
  }
  if (first_of_step) productive_s_ += step_s;
}

std::vector<telemetry::RestartCost> RestartLedger::Costs() const {
  std::vector<telemetry::RestartCost> v = closed_;
  // A fault that no group followed (yet, or ever: the job ended there) is not a restart.
  if (open_ && (open_->in_group || open_->cost.restarts > 1)) {
    telemetry::RestartCost c = open_->cost;
    if (open_->in_group) {  // so far: the start of the running group, up to its workers running
      c.start_s += Secs(open_->mark, std::max(open_->mark, open_->running));
    } else {
      --c.restarts;  // the span's last fault (the one that ended the job) had no restart
    }
    v.push_back(c);
  }
  return v;
}

double RestartLedger::lost_s() const {
  double sum = 0;
  for (const telemetry::RestartCost& c : Costs()) sum += c.total_s();
  return sum;
}

}  // namespace dlrun::launcher
