// The agent's run directory over its lifetime (app/run_location.h picks where it is): per attempt,
// each worker's error file, its logs and the Flight Recorder's dumps when logs are written
// (--log-dir), the stacks captured before a kill; workers.json for `dlrun stacks`. After the
// run it is named and kept, or removed (Finish). The agent reads and writes the run directory
// only through this, and this only through its FileSystem (launcher/base/file_system.h).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "launcher/base/file_system.h"
#include "launcher/stacks/flight_recorder.h"
#include "launcher/stacks/stacks.h"
#include "launcher/workers/root_cause.h"

namespace dlrun::launcher {

class RunDir {
 public:
  // `path`: the run directory (empty: none, nothing is written); `keep`: a kept log directory;
  // `log_dir`: where the workers' logs go (empty: the console only).
  RunDir(FileSystem& fs, std::string path, bool keep, std::string log_dir)
      : fs_(fs), path_(std::move(path)), keep_(keep), log_dir_(std::move(log_dir)) {}

  const std::string& path() const { return path_; }
  bool has_logs() const { return !log_dir_.empty(); }

  // RUN_DIR/attempt_K/LOCAL_RANK/error.json.
  std::string ErrorFile(int attempt, int local_rank) const;
  // The same, its directory made and a stale file from an earlier run removed.
  std::string FreshErrorFile(int attempt, int local_rank) const;
  // The worker's error file of that attempt (an empty record without one).
  ErrorRecord ReadErrorRecord(int attempt, int local_rank) const;
  // LOG_DIR/attempt_K/fr: the Flight Recorder's dumps of the attempt; Make... makes it.
  std::string FlightRecorderDir(int attempt) const;
  std::string MakeFlightRecorderDir(int attempt) const;
  // The attempt's dumps, by rank; unreadable ones go to `errors`.
  std::vector<FrRank> ReadFlightRecorder(int attempt, std::vector<std::string>* errors) const;
  // LOG_DIR/attempt_K/LOCAL_RANK (made; a warning when it cannot be): the worker's logs.
  std::string WorkerLogDir(int attempt, int local_rank) const;
  // RUN_DIR/workers.json, for `dlrun stacks`.
  absl::Status WriteWorkers(const WorkersFile& w) const;
  // RUN_DIR/attempt_K/stacks.{json,txt}: a capture before kill. Returns where, for the log line.
  std::string WriteStacks(int attempt, const StackReport& r) const;
  // After the run: a kept directory is named; a scratch one is kept (and named) only when a
  // failed run left error files or stacks in it, or `dlrun profile` left profiles; else removed.
  void Finish(int rc) const;

 private:
  FileSystem& fs_;
  std::string path_;
  bool keep_ = false;
  std::string log_dir_;
};

}  // namespace dlrun::launcher
