// FailureVerdict (launcher/agent/failure_verdict.h), the failure path's pure decisions, row by
// row: a run of failures and the route each takes (the repeat rule, the fallback once per
// step), whether the first failure's stacks tell something, and dlrun's exit code.
#include "launcher/agent/failure_verdict.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dlrun::launcher::failure_verdict_test {
namespace {

using Route = FailureVerdict::Route;

FailureSignature Sig(FailureClass cls, int rank, int64_t step, std::string message = "boom") {
  return {cls, rank, step, std::move(message)};
}

struct Row {
  const char* what;
  // The failures in order, each with whether the node recovers in process and every worker
  // declared it; the route of each.
  std::vector<FailureVerdict::Facts> failures;
  std::vector<Route> routes;
};

TEST(FailureVerdict, EveryRowOfTheRouteTable) {
  const auto oom = FailureClass::kCudaOom;
  const auto exit = FailureClass::kExit;
  const auto hang = FailureClass::kHang;
  const auto sig = FailureClass::kSignal;
  const std::vector<Row> rows = {
      {"a first failure restarts counted", {{Sig(exit, 1, 7), false, false}}, {Route::kCounted}},
      {"an OOM again on the same rank at the same step ends the job",
       {{Sig(oom, 1, 7), false, false}, {Sig(oom, 1, 7), false, false}},
       {Route::kCounted, Route::kEndRepeated}},
      {"the same OOM one step later repeats it too",
       {{Sig(oom, 1, 7), false, false}, {Sig(oom, 1, 8), false, false}},
       {Route::kCounted, Route::kEndRepeated}},
      {"an OOM on another rank is a new failure",
       {{Sig(oom, 1, 7), false, false}, {Sig(oom, 2, 7), false, false}},
       {Route::kCounted, Route::kCounted}},
      {"a signal from outside never repeats",
       {{Sig(sig, 1, 7), false, false}, {Sig(sig, 1, 7), false, false}},
       {Route::kCounted, Route::kCounted}},
      {"a plain exit with the same message at a known step repeats",
       {{Sig(exit, 0, 3, "ValueError: x"), false, false},
        {Sig(exit, 0, 3, "ValueError: x"), false, false}},
       {Route::kCounted, Route::kEndRepeated}},
      {"a plain exit before any step does not",
       {{Sig(exit, 0, -1, "ValueError: x"), false, false},
        {Sig(exit, 0, -1, "ValueError: x"), false, false}},
       {Route::kCounted, Route::kCounted}},
      {"a declaring program recovered in process falls back once per step",
       {{Sig(sig, 1, 7), true, true}, {Sig(sig, 1, 7), true, true}, {Sig(sig, 1, 9), true, true}},
       {Route::kFallBack, Route::kCounted, Route::kFallBack}},
      {"a group where not every worker declared restarts counted",
       {{Sig(sig, 1, 7), true, false}}, {Route::kCounted}},
      {"a node that does not recover in process restarts counted",
       {{Sig(sig, 1, 7), false, true}}, {Route::kCounted}},
      {"a repeat wins over the fallback",
       {{Sig(oom, 1, 7), true, true}, {Sig(oom, 1, 7), true, true}},
       {Route::kFallBack, Route::kEndRepeated}},
      {"a hang restarts counted, even in process",
       {{Sig(hang, 2, 5, "rank 2"), true, true}}, {Route::kCounted}},
      {"a hang of the same rank at the same step again ends the job",
       {{Sig(hang, 2, 5, "rank 2"), false, false}, {Sig(hang, 2, 5, "rank 2"), false, false}},
       {Route::kCounted, Route::kEndRepeated}},
      {"a fallback's step is kept across a counted failure between",
       {{Sig(sig, 1, 7), true, true}, {Sig(sig, 1, 7), true, false}, {Sig(sig, 1, 7), true, true}},
       {Route::kFallBack, Route::kCounted, Route::kCounted}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    ASSERT_EQ(row.failures.size(), row.routes.size());
    FailureVerdict v;
    for (size_t i = 0; i < row.failures.size(); ++i) {
      EXPECT_EQ(v.Decide(row.failures[i]), row.routes[i]) << "failure " << i;
    }
  }
}

WorkerExit Exited(int code, int signal = 0) {
  WorkerExit e;
  e.exit_code = code;
  e.signal = signal;
  return e;
}

TEST(FailureVerdict, TheStacksTellOfASignalAWaitOrAnExceptionWithoutItsTraceback) {
  const ErrorRecord with_tb{"ValueError: x", 1.0, "Traceback (most recent call last): ..."};
  const ErrorRecord without_tb{"ValueError: x", 1.0, ""};
  struct {
    const char* what;
    WorkerExit exit;
    ErrorRecord record;
    FailureClass cls;
    bool tells;
  } rows[] = {
      {"a signal", Exited(0, 11), with_tb, FailureClass::kSegfault, true},
      {"an exception with its traceback", Exited(1), with_tb, FailureClass::kExit, false},
      {"an exception without one", Exited(1), without_tb, FailureClass::kExit, true},
      {"a collective's timeout", Exited(1), with_tb, FailureClass::kCollectiveTimeout, true},
      {"a lost peer", Exited(1), with_tb, FailureClass::kPeerLost, true},
      {"a CUDA OOM with its traceback", Exited(1), with_tb, FailureClass::kCudaOom, false},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(FailureVerdict::StacksTell(r.exit, r.record, r.cls), r.tells) << r.what;
  }
}

TEST(FailureVerdict, TheExitCodeIsOneOrTheWorkersOwn) {
  EXPECT_EQ(FailureVerdict::ExitCode(false, Exited(3)), 1);
  EXPECT_EQ(FailureVerdict::ExitCode(true, Exited(3)), 3);
  EXPECT_EQ(FailureVerdict::ExitCode(true, Exited(0, 9)), 137);
}

}  // namespace
}  // namespace dlrun::launcher::failure_verdict_test
