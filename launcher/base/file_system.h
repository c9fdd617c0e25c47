// The agent's way to the file system (as LevelDB's Env): the run directory, error files, the
// Flight Recorder's dumps, captures and --report-json go through a FileSystem, so the agent
// writes no file itself and its tests run on MemoryFileSystem, with no temporary directory.
// Workers are real processes (or fakes that write through the same MemoryFileSystem).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dlrun::launcher {

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // The whole file. NotFound when it does not exist; InvalidArgument when it holds more than
  // `max_bytes` (nothing is read then).
  virtual absl::StatusOr<std::string> Read(const std::string& path,
                                           size_t max_bytes = size_t{64} << 20) const = 0;
  // Replaces `path` atomically (a temporary beside it, renamed) with permissions `mode`; the
  // parent directories are made. An error names the path.
  virtual absl::Status Write(const std::string& path, const std::string& data, mode_t mode) = 0;
  absl::Status Write(const std::string& path, const std::string& data) {
    return Write(path, data, 0644);
  }
  virtual absl::Status MakeDirs(const std::string& path) = 0;
  // A file; one that does not exist is no error.
  virtual void Remove(const std::string& path) = 0;
  // A directory and all below it.
  virtual void RemoveAll(const std::string& path) = 0;
  // The regular files in `dir` (names), or with `recursive` every one below it (paths relative
  // to `dir`); sorted; empty when `dir` does not exist.
  virtual std::vector<std::string> List(const std::string& dir, bool recursive) const = 0;
};

// The real one (POSIX), shared by the process.
FileSystem& PosixFileSystem();

// Files in memory, for tests: paths are plain strings ("/run/attempt_0/0/error.json"), and
// directories exist once made or once a file is written below them. Thread-safe.
class MemoryFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::string> Read(const std::string& path,
                                   size_t max_bytes = size_t{64} << 20) const override;
  using FileSystem::Write;
  absl::Status Write(const std::string& path, const std::string& data, mode_t mode) override;
  absl::Status MakeDirs(const std::string& path) override;
  void Remove(const std::string& path) override;
  void RemoveAll(const std::string& path) override;
  std::vector<std::string> List(const std::string& dir, bool recursive) const override;
  bool Exists(const std::string& path) const;  // a file or a directory
  mode_t ModeOf(const std::string& path) const;  // 0 for no such file

 private:
  void MakeParents(const std::string& path);  // mu_ held
  mutable std::mutex mu_;
  std::map<std::string, std::pair<std::string, mode_t>> files_;
  std::set<std::string> dirs_;
};

}  // namespace dlrun::launcher
