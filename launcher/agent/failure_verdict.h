// What the agent does after a failure or a hang, decided from facts alone: the pure half of
// FailurePolicy (failure_policy.h), as RecoveryMachine is InProcessRecovery's. No I/O, no clock,
// no logging; FailurePolicy reads the facts (the group's exits, the error files, the stacks),
// asks this, and carries the decision out (the membership source asked, the lines logged).
#pragma once

#include <cstdint>
#include <optional>

#include "launcher/workers/root_cause.h"

namespace dlrun::launcher {

class FailureVerdict {
 public:
  // Where a failure goes.
  enum class Route {
    kEndRepeated,  // it repeats the last attempt's the same way: the job ends (a restart would
                   // repeat it too), told to the membership source as final
    kFallBack,     // a program that declared in-process recovery restarts from its checkpoint
                   // without counting against --max-restarts (once per step it failed at)
    kCounted,      // an ordinary restart, counted: the membership source says whether one is left
  };
  struct Facts {
    FailureSignature now;       // this attempt's root failure (a hang's: class kHang)
    bool in_process = false;    // this node recovers a declaring program in process
    bool all_declared = false;  // every worker of the group declared in-process recovery
  };
  // The route for `f`; it becomes the last failure (and the last fallback's step).
  Route Decide(const Facts& f);

  // Whether the first failure's stacks tell something (--capture-before-kill auto reads them
  // before the stop): a signal, an exception without its traceback, or one that says it waited
  // on others (a collective's timeout, a lost peer); not a plain exception whose traceback is
  // in its error file. `cls`: its class from what it left.
  static bool StacksTell(const WorkerExit& first, const ErrorRecord& record, FailureClass cls);
  // dlrun's exit code when a failure ends the job: the worker's own (128+N for signal N) with
  // --exit-with-worker-code, else 1 as torchrun's.
  static int ExitCode(bool exit_with_worker_code, const WorkerExit& first);

 private:
  std::optional<FailureSignature> last_;      // the last attempt's root failure
  std::optional<int64_t> last_fallback_step_;  // the step of the last uncounted restart
};

}  // namespace dlrun::launcher
