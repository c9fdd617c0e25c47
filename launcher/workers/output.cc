#include "launcher/workers/output.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dlrun::launcher {
namespace {

// PyTorch 2.x prefixes a worker's error lines with its own "[rank1]:" (torch.distributed's
// logging and the traceback it prints): behind dlrun's prefix that read "[rank 1]: [rank1]: ...".
// The line keeps one prefix, dlrun's, which a log grep can rely on.
absl::string_view WithoutTorchsRankPrefix(absl::string_view line) {
  absl::string_view rest = line;
  if (!absl::ConsumePrefix(&rest, "[rank")) return line;
  const size_t digits = rest.find_first_not_of("0123456789");
  if (digits == 0 || digits == absl::string_view::npos) return line;
  rest.remove_prefix(digits);
  if (!absl::ConsumePrefix(&rest, "]:")) return line;
  absl::ConsumePrefix(&rest, " ");
  return rest;
}

}  // namespace

LineStream::LineStream(std::string prefix, int console_fd, FILE* log)
    : prefix_(std::move(prefix)), console_fd_(console_fd), log_(log) {}

LineStream::~LineStream() { Finish(); }

void LineStream::Feed(const char* data, size_t n) {
  if (log_ != nullptr) std::fwrite(data, 1, n, log_);
  tail_.append(data, n);
  if (tail_.size() > kTailBytes) tail_.erase(0, tail_.size() - kTailBytes);
  if (console_fd_ < 0) return;
  partial_.append(data, n);
  // A line ends at '\n', and also at '\r': a progress bar redrawing its line shows each state,
  // with the prefix written again after each '\r' so it stays in column 0.
  std::string out;
  size_t start = 0;
  for (size_t end; (end = partial_.find_first_of("\r\n", start)) != std::string::npos;
       start = end + 1) {
    const absl::string_view line = absl::string_view(partial_).substr(start, end + 1 - start);
    if (open_line_ || (line == "\n" && after_cr_)) {
      absl::StrAppend(&out, line);  // the prefix is out already, or this ends a "\r\n"
    } else {
      absl::StrAppend(&out, prefix_, prefix_.empty() ? line : WithoutTorchsRankPrefix(line));
    }
    open_line_ = false;
    after_cr_ = partial_[end] == '\r';
  }
  partial_.erase(0, start);
  // After a '\r' the line being redrawn is shown as it comes (a bar's state has no '\n').
  if (after_cr_ && !partial_.empty()) {
    absl::StrAppend(&out, open_line_ ? "" : prefix_, partial_);
    partial_.clear();
    open_line_ = true;
  }
  Write(out);
}

void LineStream::Finish() {
  if (console_fd_ >= 0 && (!partial_.empty() || open_line_)) {
    Write(absl::StrCat(open_line_ ? "" : prefix_, partial_, "\n"));
    partial_.clear();
    open_line_ = false;
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
