#include "launcher/agent/run_dir.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

std::string RunDir::ErrorFile(int attempt, int local_rank) const {
  return absl::StrCat(path_, "/attempt_", attempt, "/", local_rank, "/", contract::kErrorFileName);
}

std::string RunDir::FreshErrorFile(int attempt, int local_rank) const {
  const std::string err = ErrorFile(attempt, local_rank);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(err).parent_path(), ec);
  std::filesystem::remove(err, ec);  // a stale file must not be taken for this attempt's
  return err;
}

std::string RunDir::FlightRecorderDir(int attempt) const {
  return absl::StrCat(log_dir_, "/attempt_", attempt, "/", contract::kFrDir);
}

std::string RunDir::MakeFlightRecorderDir(int attempt) const {
  const std::string fr = FlightRecorderDir(attempt);
  std::error_code ec;
  std::filesystem::create_directories(fr, ec);
  return fr;
}

std::string RunDir::WorkerLogDir(int attempt, int local_rank) const {
  const std::string dir = absl::StrCat(log_dir_, "/attempt_", attempt, "/", local_rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) spdlog::warn("cannot write logs in {}: {}", dir, ec.message());
  return dir;
}

absl::Status RunDir::WriteWorkers(const WorkersFile& w) const {
  if (path_.empty()) return absl::OkStatus();
  return WriteWorkersFile(path_, w);
}

std::string RunDir::WriteStacks(int attempt, const StackReport& r) const {
  if (path_.empty()) return "not written (no run directory)";
  const std::string dir = absl::StrCat(path_, "/attempt_", attempt);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream(dir + "/" + kStacksJsonName) << StackReportJson(r, 2) << "\n";
  std::ofstream(dir + "/stacks.txt") << FormatStackReport(r);
  return absl::StrCat("in ", dir, "/stacks.txt");
}

void RunDir::Finish(int rc) const {
  if (path_.empty()) return;
  if (keep_) {
    spdlog::info("worker logs are in {}", path_);
    return;
  }
  std::error_code ec;
  bool any = false;
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) && (it->path().filename() == contract::kErrorFileName ||
                                    it->path().filename() == kStacksJsonName)) {
      any = true;
    }
  }
  // `dlrun profile`'s files (launch.cc's live_profile writes them under RUN_DIR/profile).
  const bool profiles = !std::filesystem::is_empty(std::filesystem::path(path_) / "profile", ec) && !ec;
  if (profiles) {
    spdlog::info("the profiles dlrun profile asked for are kept in {}/profile", path_);
  } else if (rc != 0 && any) {
    spdlog::info("worker error files are kept in {}", path_);
  } else {
    std::filesystem::remove_all(path_, ec);
  }
}

}  // namespace dlrun::launcher
