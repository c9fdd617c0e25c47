#include "launcher/agent/failure_verdict.h"

namespace dlrun::launcher {

FailureVerdict::Route FailureVerdict::Decide(const Facts& f) {
  const bool repeated = last_ && RepeatsTheLast(*last_, f.now);
  last_ = f.now;
  if (repeated) return Route::kEndRepeated;
  // A hang restarts counted (its rank was killed alone when it could be recovered in process).
  if (!f.in_process || !f.all_declared || f.now.cls == FailureClass::kHang) return Route::kCounted;
  // A failure at the step the last fallback was for repeats there: the ordinary count decides.
  if (last_fallback_step_ && *last_fallback_step_ == f.now.step) return Route::kCounted;
  last_fallback_step_ = f.now.step;
  return Route::kFallBack;
}

bool FailureVerdict::StacksTell(const WorkerExit& first, const ErrorRecord& record,
                                FailureClass cls) {
  if (first.signal != 0) return true;
  return record.traceback.empty() || cls == FailureClass::kCollectiveTimeout ||
         cls == FailureClass::kPeerLost;
}

int FailureVerdict::ExitCode(bool exit_with_worker_code, const WorkerExit& first) {
  return exit_with_worker_code ? first.code() : 1;
}

}  // namespace dlrun::launcher
