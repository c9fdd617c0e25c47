#include "launcher/base/file_system.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dlrun::launcher {
namespace {

namespace fs = std::filesystem;

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? std::string() : path.substr(0, slash);
}

class Posix final : public FileSystem {
 public:
  absl::StatusOr<std::string> Read(const std::string& path, size_t max_bytes) const override {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
    if (size > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", size, " bytes, more than the ", max_bytes, " expected"));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  absl::Status Write(const std::string& path, const std::string& data, mode_t mode) override {
    if (const std::string parent = Parent(path); !parent.empty()) {
      if (absl::Status s = MakeDirs(parent); !s.ok()) return s;
    }
    const std::string tmp = absl::StrCat(path, ".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << data;
      if (!out.flush()) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
      }
    }
    ::chmod(tmp.c_str(), mode);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  absl::Status MakeDirs(const std::string& path) override {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot make ", path, ": ", ec.message()));
    return absl::OkStatus();
  }

  void Remove(const std::string& path) override {
    std::error_code ec;
    fs::remove(path, ec);
  }

  void RemoveAll(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
  }

  std::vector<std::string> List(const std::string& dir, bool recursive) const override {
    std::vector<std::string> out;
    std::error_code ec;
    if (recursive) {
      for (auto it = fs::recursive_directory_iterator(dir, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec)) out.push_back(fs::relative(it->path(), dir, ec).string());
      }
    } else {
      for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
           it.increment(ec)) {
        if (it->is_regular_file(ec)) out.push_back(it->path().filename().string());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace

FileSystem& PosixFileSystem() {
  static Posix* const fs = new Posix;
  return *fs;
}

absl::StatusOr<std::string> MemoryFileSystem::Read(const std::string& path,
                                                   size_t max_bytes) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat(path, ": No such file"));
  if (it->second.first.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", it->second.first.size(),
                                                   " bytes, more than the ", max_bytes,
                                                   " expected"));
  }
  return it->second.first;
}

void MemoryFileSystem::MakeParents(const std::string& path) {
  for (std::string p = Parent(path); !p.empty(); p = Parent(p)) dirs_.insert(p);
}

absl::Status MemoryFileSystem::Write(const std::string& path, const std::string& data,
                                     mode_t mode) {
  std::lock_guard<std::mutex> l(mu_);
  MakeParents(path);
  files_[path] = {data, mode};
  return absl::OkStatus();
}

absl::Status MemoryFileSystem::MakeDirs(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  dirs_.insert(path);
  MakeParents(path);
  return absl::OkStatus();
}

void MemoryFileSystem::Remove(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  files_.erase(path);
}

void MemoryFileSystem::RemoveAll(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  const std::string below = path + "/";
  std::erase_if(files_, [&](const auto& f) { return f.first == path || absl::StartsWith(f.first, below); });
  std::erase_if(dirs_, [&](const std::string& d) { return d == path || absl::StartsWith(d, below); });
}

std::vector<std::string> MemoryFileSystem::List(const std::string& dir, bool recursive) const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> out;
  const std::string below = dir + "/";
  for (const auto& [path, file] : files_) {
    if (!absl::StartsWith(path, below)) continue;
    const std::string rel = path.substr(below.size());
    if (recursive || rel.find('/') == std::string::npos) out.push_back(rel);
  }
  return out;  // std::map: sorted
}

bool MemoryFileSystem::Exists(const std::string& path) const {
  std::lock_guard<std::mutex> l(mu_);
  return files_.count(path) > 0 || dirs_.count(path) > 0;
}

mode_t MemoryFileSystem::ModeOf(const std::string& path) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = files_.find(path);
  return it == files_.end() ? 0 : it->second.second;
}

}  // namespace dlrun::launcher
