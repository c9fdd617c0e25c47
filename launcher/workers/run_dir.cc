#include "launcher/workers/run_dir.h"

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

std::string RunDir::ErrorFile(int attempt, int local_rank) const {
  return absl::StrCat(path_, "/attempt_", attempt, "/", local_rank, "/", contract::kErrorFileName);
}

std::string RunDir::FreshErrorFile(int attempt, int local_rank) const {
  const std::string err = ErrorFile(attempt, local_rank);
  (void)fs_.MakeDirs(err.substr(0, err.rfind('/')));
  fs_.Remove(err);  // a stale file must not be taken for this attempt's
  return err;
}

ErrorRecord RunDir::ReadErrorRecord(int attempt, int local_rank) const {
  return launcher::ReadErrorRecord(fs_, ErrorFile(attempt, local_rank));
}

std::vector<FrRank> RunDir::ReadFlightRecorder(int attempt,
                                               std::vector<std::string>* errors) const {
  return ReadFlightRecorderDir(fs_, FlightRecorderDir(attempt), contract::kFrFilePrefix, errors);
}

std::string RunDir::FlightRecorderDir(int attempt) const {
  return absl::StrCat(log_dir_, "/attempt_", attempt, "/", contract::kFrDir);
}

std::string RunDir::MakeFlightRecorderDir(int attempt) const {
  const std::string fr = FlightRecorderDir(attempt);
  (void)fs_.MakeDirs(fr);
  return fr;
}

std::string RunDir::WorkerLogDir(int attempt, int local_rank) const {
  const std::string dir = absl::StrCat(log_dir_, "/attempt_", attempt, "/", local_rank);
  if (absl::Status s = fs_.MakeDirs(dir); !s.ok()) {
    spdlog::warn("cannot write logs: {}", std::string(s.message()));
  }
  return dir;
}

absl::Status RunDir::WriteWorkers(const WorkersFile& w) const {
  if (path_.empty()) return absl::OkStatus();
  return WriteWorkersFile(fs_, path_, w);
}

std::string RunDir::WriteStacks(int attempt, const StackReport& r) const {
  if (path_.empty()) return "not written (no run directory)";
  const std::string dir = absl::StrCat(path_, "/attempt_", attempt);
  absl::Status s = fs_.Write(absl::StrCat(dir, "/", kStacksJsonName), StackReportJson(r, 2) + "\n");
  if (s.ok()) s = fs_.Write(dir + "/stacks.txt", FormatStackReport(r));
  if (!s.ok()) return absl::StrCat("not written: ", s.message());
  return absl::StrCat("in ", dir, "/stacks.txt");
}

void RunDir::Finish(int rc) const {
  if (path_.empty()) return;
  if (keep_) {
    spdlog::info("worker logs are in {}", path_);
    return;
  }
  bool any = false;
  for (const std::string& f : fs_.List(path_, /*recursive=*/true)) {
    const std::string name = f.substr(f.rfind('/') + 1);
    if (name == contract::kErrorFileName || name == kStacksJsonName) any = true;
  }
  // `dlrun profile`'s files (launch.cc's live_profile writes them under RUN_DIR/profile).
  const bool profiles = !fs_.List(path_ + "/profile", /*recursive=*/true).empty();
  if (profiles) {
    spdlog::info("the profiles dlrun profile asked for are kept in {}/profile", path_);
  } else if (rc != 0 && any) {
    spdlog::info("worker error files are kept in {}", path_);
  } else {
    fs_.RemoveAll(path_);
  }
}

}  // namespace dlrun::launcher
