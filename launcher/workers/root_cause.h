// Which failure ended the job: torchrun's rule. Among the workers that failed on their own (not
// those the agent stopped), the one whose error file (TORCHELASTIC_ERROR_FILE) has the earliest
// timestamp; without error files, the first to exit. Pure: the error files are read through
// a function, so tests need no files.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/base/file_system.h"

namespace dlrun::launcher {

// How one worker ended.
struct WorkerExit {
  int local_rank = -1;
  int global_rank = -1;
  pid_t pid = -1;
  int exit_code = 0;     // valid when signal == 0
  int signal = 0;        // the signal that killed it, or 0
  double when_s = 0;     // wall clock seconds since the epoch
  bool stopped = false;  // ended while the agent was stopping the group (not a cause)
  // Died of a signal after it said its work was done (a "D done" record): the interpreter's
  // teardown, not the training; finished, with a warning (docs/USAGE.md, "Done").
  bool after_done = false;
  bool failed() const { return !after_done && (signal != 0 || exit_code != 0); }
  // The code dlrun reports for it: the exit code, or 128 + the signal.
  int code() const { return signal != 0 ? 128 + signal : exit_code; }
};

struct ErrorRecord {
  std::string message;  // empty: no (readable) file
  double timestamp = 0;
  std::string traceback;  // extraInfo.py_callstack, when the worker wrote one
};

// Reads a torchelastic error file:
// {"message": {"message": "...", "extraInfo": {"timestamp": "<epoch s>", ...}}}.
ErrorRecord ReadErrorRecord(const FileSystem& fs, const std::string& path);

// What kind of failure a worker's end was; the names are the failure block's and
// --report-json's "class" (docs/USAGE.md, Failures).
enum class FailureClass {
  kExit,               // exit_code != 0, nothing more specific known
  kSignal,             // killed by a signal other than those below
  kSegfault,           // SIGSEGV or SIGBUS
  kCudaOom,            // "CUDA out of memory" in the error file or the last stderr bytes
  kHostOom,            // SIGKILL while the memory cgroup's OOM-kill count went up
  kCollectiveTimeout,  // an NCCL/Gloo collective timed out (its watchdog, or Gloo's "Timed out")
  kPeerLost,           // a peer's connection closed or reset, or the communicator aborted
  kHang,               // hang detection stopped it (hang_watch.h): no step, heartbeat or CPU use
};
const char* FailureClassName(FailureClass c);

struct Classification {
  FailureClass cls = FailureClass::kExit;
  std::optional<int> peer_rank;  // kCollectiveTimeout, kPeerLost: when the message names it
};

// `text`: what the worker left (its error file's message and traceback, its last stderr bytes);
// `oom_killed`: the memory cgroup's OOM-kill count went up while its group ran.
Classification ClassifyFailure(const WorkerExit& e, std::string_view text, bool oom_killed);
// A failure that points at the node rather than the program (docs/USAGE.md "Preflight and bad
// nodes"): an uncorrectable ECC or NVLink error, an XID or a lost GPU, a CUDA error a program's
// bug does not cause (an unspecified launch failure, a device busy or unavailable; not a
// device-side assert, an illegal address or out of memory), a segfault inside a CUDA library,
// or the host's OOM killer. What it was, in a few words; empty when it does not point at the
// node.
std::string HardwareFault(const Classification& c, std::string_view text);
// The last non-blank line of a worker's stderr tail (what a failure without an error file
// said), or empty.
std::string LastLine(std::string_view text);
// What to try for a class (the seeds' advice), or empty.
std::string FailureAdvice(FailureClass c);

// One attempt's root failure, to tell a failure that repeats from a new one.
struct FailureSignature {
  FailureClass cls = FailureClass::kExit;
  int rank = -1;
  int64_t step = -1;    // the rank's last step record in that attempt; -1: none
  std::string message;  // what it said (the error file's message, or its last stderr line)
};
// Whether `now` repeats `last`, so that restarting again would only repeat it too: the same
// class, the same rank, within one step of it (or both before any step record), for the classes
// a restart does not change: CUDA and host OOM, segfault, a hang; and a plain exit with the
// same message at a known step. Signals, timeouts and lost peers come from outside and never count.
bool RepeatsTheLast(const FailureSignature& last, const FailureSignature& now);

struct RootCause {
  bool found = false;
  WorkerExit exit;
  std::string message;  // the error file's message, or "exit code N" / "Signal N (SIGX) ..."
};

// `error_of(local_rank)` returns that worker's error record for this attempt.
RootCause PickRootCause(const std::vector<WorkerExit>& exits,
                        const std::function<ErrorRecord(int local_rank)>& error_of);

// torchrun's failure block (its ChildFailedError), so people and log scrapers find what they
// know: "<program> FAILED", the other failures, then "Root Cause (first observed failure)" with
// time, host, rank, local_rank, exitcode (negative for a signal, as torchrun), error_file and
// traceback.
struct FailureReport {
  std::string program;  // what the workers ran, e.g. "train.py"
  std::string hostname;
  std::vector<WorkerExit> exits;  // this attempt's, in exit order
  RootCause root;
  std::function<std::string(int local_rank)> error_file_of;
  std::function<ErrorRecord(int local_rank)> error_of;
  // Each failure's class, printed as "class     : ..." (empty: no line).
  std::function<Classification(const WorkerExit&)> class_of = nullptr;
};
std::string FormatFailureReport(const FailureReport& r);

}  // namespace dlrun::launcher
