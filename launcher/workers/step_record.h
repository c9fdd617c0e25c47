// Step records (docs/TELEMETRY.md): what a worker says about each training step on
// its heartbeat pipe (contract::kHeartbeatFd), one text line per step:
//   S <step> <samples> <step_s> [data_s=<s>] [compute_s=<s>] [sync_s=<s>] [loss=<x>]\n
// and, once after a restart, what the worker resumed from (the restart ledger, TELEMETRY.md):
//   R <step> <load_s>\n     resumed from the checkpoint of <step>, loading it took <load_s> s
// and for in-process recovery (docs/RECOVERY.md):
//   C recovery\n            this worker can survive a peer's loss (the agent keeps it then)
//   P <step> <xfer_s>\n     after a peer's loss: this rank holds the state of <step>, taken from
//                           (or sent to) a peer in <xfer_s> s since its collective gave up
// and around work that is not a step (an evaluation, a checkpoint save), so hang detection
// does not count it (docs/USAGE.md, "Hangs"):
//   Z pause <what>\n         from now on, until "Z resume"
//   Z resume\n
// and once, when the program has finished its work (dlrun_report.done()), so that a death by a
// signal in the interpreter's teardown after it does not count as a failure (docs/USAGE.md):
//   D done\n
// At most kMaxStepRecord bytes, so one write() of it is atomic on a pipe. Bytes outside a
// record are plain heartbeats, as before; a malformed record is counted and dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlrun::launcher {

inline constexpr size_t kMaxStepRecord = 256;
// The first letters of the records; any other byte outside a record is a heartbeat.
inline constexpr char kStepRecordLetters[] = "SRCPZD";

// What a record says (its first letter on the pipe).
enum class RecordKind : char {
  kStep = 'S',      // a step
  kResumed = 'R',   // resumed: `step` the checkpoint's step, `step_s` the load's seconds
  kDeclared = 'C',  // in-process recovery declared
  kRefused = 'F',   // the rank refuses the in-process recovery under way ("C refused RULE",
                    // `what`: the rule)
  kFromPeer = 'P',  // state from a peer: `step`, `step_s` its seconds
  kPause = 'Z',     // a pause of hang detection begins (`what`: why)
  kUnpause = 'z',   // it ends
  kDone = 'D',      // the program's work is done
};

struct StepRecord {
  RecordKind kind = RecordKind::kStep;
  std::string what;
  int64_t step = 0;
  int64_t samples = 0;
  double step_s = 0;
  std::optional<double> data_s, compute_s, sync_s, loss;
};

// Parses one record line (without its '\n'); nullopt if malformed.
std::optional<StepRecord> ParseStepRecord(const std::string& line);

// Splits a heartbeat pipe's byte stream into records, across reads.
class StepRecordReader {
 public:
  // Appends the complete records in `data` to `out`.
  void Feed(const char* data, size_t n, std::vector<StepRecord>* out);
  int64_t bad() const { return bad_; }

 private:
  bool in_record_ = false;
  bool overlong_ = false;
  std::string line_;
  int64_t bad_ = 0;
};

}  // namespace dlrun::launcher
