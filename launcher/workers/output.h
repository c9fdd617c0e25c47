// One worker stream on its way to the console and a log file: bytes are logged as they come,
// and whole lines (ended by '\n' or '\r') reach the console with the rank prefix
// ("[rank 3]: "), so the lines of several workers never interleave mid-line and progress bars
// redraw live. An unfinished last line is printed (with a newline) when the stream ends.
#pragma once

#include <cstdio>
#include <string>

namespace dlrun::launcher {

class LineStream {
 public:
  // `console_fd` < 0: not shown; `log` may be null (not logged). Takes ownership of `log`.
  LineStream(std::string prefix, int console_fd, FILE* log);
  ~LineStream();
  LineStream(const LineStream&) = delete;
  LineStream& operator=(const LineStream&) = delete;

  void Feed(const char* data, size_t n);
  // The stream ended: flush an unfinished line and close the log.
  void Finish();
  // The last kTailBytes fed (what a failure's classification reads: root_cause.h).
  static constexpr size_t kTailBytes = 4096;
  const std::string& tail() const { return tail_; }

 private:
  void Write(const std::string& text);

  std::string prefix_;
  int console_fd_;
  FILE* log_;
  std::string partial_;
  bool after_cr_ = false;   // the last line written ended with '\r'
  bool open_line_ = false;  // a redrawn line's start (and prefix) is written, its end is not
  std::string tail_;
};

}  // namespace dlrun::launcher
