#include "checkpoint_file.h"
#include "checkpoint_testing.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>

#include "fnv1a.h"
#include "text.h"

namespace dlrun::worker {
namespace {

constexpr char kMagic[8] = {'D', 'L', 'R', 'U', 'N', 'C', 'K', '1'};
constexpr size_t kHeader = 24;

void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::runtime_error Errno(const std::string& what, const std::string& path) {
  return std::runtime_error(lite::StrCat("checkpoint: ", what, " ", path, ": ", std::strerror(errno)));
}

std::function<void(size_t)>& WriteHook() {
  static std::function<void(size_t)> hook;
  return hook;
}

}  // namespace

namespace testing_only {
void SetCheckpointWriteHook(std::function<void(size_t)> hook) { WriteHook() = std::move(hook); }
}  // namespace testing_only

namespace detail {

std::string CheckpointHeader(const std::string& payload) {
  std::string header(kMagic, sizeof kMagic);
  PutU64(&header, payload.size());
  PutU64(&header, Fnv1a(payload.data(), payload.size()));
  return header;
}

std::string CheckpointFileProblem(const std::string& data) {
  if (data.size() < kHeader || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    return "not a dlrun checkpoint (bad magic or truncated header)";
  }
  if (GetU64(data.data() + 8) != data.size() - kHeader) {
    return lite::StrCat("payload is ", data.size() - kHeader, " bytes, header says ",
                        GetU64(data.data() + 8), " (truncated?)");
  }
  if (GetU64(data.data() + 16) != Fnv1a(data.data() + kHeader, data.size() - kHeader)) {
    return "checksum mismatch (the file is damaged)";
  }
  return "";
}

std::string CheckpointPayload(const std::string& data) { return data.substr(kHeader); }

void WriteThenRename(const std::string& header, const std::string& payload, const std::string& tmp,
                     const std::string& final_path) {
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Errno("cannot create", tmp);
  size_t written = 0;
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      const size_t chunk = std::min<size_t>(n, 1 << 20);
      ssize_t w = write(fd, p, chunk);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
      written += static_cast<size_t>(w);
      if (WriteHook()) WriteHook()(written);
    }
    return true;
  };
  if (!write_all(header.data(), header.size()) || !write_all(payload.data(), payload.size()) ||
      fsync(fd) != 0) {
    std::runtime_error e = Errno("cannot write", tmp);
    close(fd);
    unlink(tmp.c_str());
    throw e;
  }
  close(fd);
  if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    std::runtime_error e = Errno("cannot rename to", final_path);
    unlink(tmp.c_str());
    throw e;
  }
}

void SyncDirectory(const std::string& dir) {
  if (int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string CheckpointFileName(int64_t step) {
  return lite::StrFormat("ckpt-%012lld.dlrun", static_cast<long long>(step));
}

int64_t StepOfCheckpointFile(const std::string& path) {
  long long step = -1;
  const std::string name = std::filesystem::path(path).filename().string();
  return std::sscanf(name.c_str(), "ckpt-%lld.dlrun", &step) == 1 ? step : -1;
}

}  // namespace detail
}  // namespace dlrun::worker
