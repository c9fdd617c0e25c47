// The restart ledger (docs/TELEMETRY.md, "Time lost to restarts"): what each restart of this
// node's worker group cost, by phase, and the time spent in steps that were kept (for goodput).
// A restart's span runs from the end of the last step finished before the fault to the start of
// the first step past it; the agent marks the boundaries and the workers' records fill in the
// rest:
//
//   last step ends   fault seen   stopped     assigned     first step begins   first new step
//   |-- detection --|-- stop ---|-- rendezvous --|-- start + load --|-- recomputed --|
//
// A fault during the recovery (the new group failed before passing the old step) extends the
// same span: one outage, `restarts` = 2. Pure logic on the agent's Clock times; no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "launcher/workers/clock.h"
#include "telemetry/telemetry.h"

namespace dlrun::launcher {

// A restart whose span is still open (RestartLedger's; at namespace scope, since clang cannot
// default-construct a nested struct with member initializers inside std::optional's traits
// while the enclosing class is incomplete).
struct OpenRestart {
  telemetry::RestartCost cost;
  SteadyTime mark;                        // the end of the last phase counted
  bool in_group = false;                  // a group runs since the fault
  std::optional<SteadyTime> first_begin;  // the first step of that group began
  double load_s = 0;                      // that group's checkpoint load (the slowest rank's)
  // In-process recovery: the state transfer from a peer (the fastest rank's); none said yet.
  std::optional<double> peer_s;
  SteadyTime running{};  // that group's workers were running
};

class RestartLedger {
 public:
  // The agent saw a fault (a worker failed, a hang, a new round) at `t`; `admission`: no fault,
  // a node joining the running group (the span is labelled so).
  void FaultSeen(SteadyTime t, bool admission = false);
  // The old group has stopped.
  void Stopped(SteadyTime t);
  // A group runs: its assignment (restart count `restart`) arrived at `assigned`, its workers
  // were running at `running`.
  // `generation`: an in-process recovery's group generation (0: a restarted group).
  void GroupStarted(int restart, SteadyTime assigned, SteadyTime running, int generation = 0);
  // This node's own failure caused the span in progress, described as `cause` (the first kept).
  void Cause(const std::string& cause);
  // A worker's step record arrived at `now` (the step's end): step `step` took `step_s`.
  void Step(int64_t step, double step_s, SteadyTime now);
  // A worker said it resumed from the checkpoint of `step`; loading took `load_s`.
  void Resumed(int64_t step, double load_s);
  // How the current group's new processes started (after GroupStarted): counted in the span.
  void StartedAs(int forked, int spare, int cold);
  // In-process recovery: a rank holds the state of `step`, from a peer in `s` seconds.
  void StateFromPeer(int64_t step, double s);
  // In-process recovery: every rank holds the state at `t`. Where no step record ever came (a
  // program that reports no steps, or a fault before the first), no later step can close the
  // span: it ends here, counted up to the recovery's end (else it would stay "so far" at 0 s).
  void RecoveryDone(SteadyTime t);

  // Every restart so far, the one in progress last (its figures so far, resumed = false). A
  // fault that no new group followed is left out: the job ended there.
  std::vector<telemetry::RestartCost> Costs() const;
  double lost_s() const;
  double productive_s() const { return productive_s_; }

 private:
  // The open span's current group ends at `t` without passing the fault's step.
  void CloseGroup(SteadyTime t);
  // The open span is over: kept with the closed ones (the oldest folded past the cap).
  void Close();

  std::vector<telemetry::RestartCost> closed_;
  std::optional<OpenRestart> open_;
  int64_t high_step_ = -1;              // the highest step any group finished
  std::optional<SteadyTime> last_end_;  // the current group's latest step end
  int64_t counted_step_ = -1;  // the current group's highest step counted (once, not per rank)
  double productive_s_ = 0;
};

}  // namespace dlrun::launcher
