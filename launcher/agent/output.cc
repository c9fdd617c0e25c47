#include "launcher/agent/output.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace dlrun::launcher {

LineStream::LineStream(std::string prefix, int console_fd, FILE* log)
    : prefix_(std::move(prefix)), console_fd_(console_fd), log_(log) {}

LineStream::~LineStream() { Finish(); }

void LineStream::Feed(const char* data, size_t n) {
  if (log_ != nullptr) std::fwrite(data, 1, n, log_);
  if (console_fd_ < 0) return;
  partial_.append(data, n);
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    absl::StrAppend(&out, prefix_, absl::string_view(partial_).substr(start, nl + 1 - start));
  }
  partial_.erase(0, start);
  Write(out);
}

void LineStream::Finish() {
  if (console_fd_ >= 0 && !partial_.empty()) {
    Write(absl::StrCat(prefix_, partial_, "\n"));
    partial_.clear();
  }
  if (log_ != nullptr) std::fclose(log_);
  log_ = nullptr;
}

void LineStream::Write(const std::string& text) {
  if (text.empty()) return;
  if (console_fd_ == STDERR_FILENO) std::fflush(stdout);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = write(console_fd_, text.data() + done, text.size() - done);
    if (w <= 0) return;  // the console is gone: drop, never block the agent on it
    done += static_cast<size_t>(w);
  }
}

}  // namespace dlrun::launcher
