#include "launcher/stacks/crash_trace.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dlrun::launcher {
namespace {

constexpr absl::string_view kPyCurrent = "Current thread ";
constexpr absl::string_view kPyThread = "Thread ";
constexpr absl::string_view kMostRecent = "(most recent call first):";
constexpr absl::string_view kNativeHead = "dlrun::worker: fatal signal ";

// `  File "/tmp/x.py", line 3 in crash`
std::optional<StackFrame> PythonFrame(absl::string_view line) {
  line = absl::StripLeadingAsciiWhitespace(line);
  if (!absl::ConsumePrefix(&line, "File \"")) return std::nullopt;
  const size_t q = line.find("\", line ");
  if (q == absl::string_view::npos) return std::nullopt;
  StackFrame f;
  f.file = std::string(line.substr(0, q));
  absl::string_view rest = line.substr(q + 8);
  const size_t in = rest.find(" in ");
  if (in == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, in), &f.line)) {
    return std::nullopt;
  }
  f.function = std::string(absl::StripAsciiWhitespace(rest.substr(in + 4)));
  return f;
}

std::string Demangle(const std::string& name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : name;
}

// `  #0 /path/lib.so+0x1a2b3c symbol` (the symbol may be missing)
std::optional<StackFrame> NativeFrame(absl::string_view line) {
  line = absl::StripLeadingAsciiWhitespace(line);
  if (!absl::ConsumePrefix(&line, "#")) return std::nullopt;
  const size_t sp = line.find(' ');
  if (sp == absl::string_view::npos) return std::nullopt;
  line = line.substr(sp + 1);
  const size_t end = line.find(' ');
  const absl::string_view where = line.substr(0, end);
  const size_t plus = where.rfind("+0x");
  StackFrame f;
  if (plus == absl::string_view::npos ||
      !absl::SimpleHexAtoi(where.substr(plus + 3), &f.offset)) {
    return std::nullopt;
  }
  f.module = std::string(where.substr(0, plus));
  if (f.module == "??") f.module.clear();  // an address outside any module: nothing to name
  f.file = f.module.empty() ? "??" : f.module;
  f.function = end == absl::string_view::npos
                   ? "??"
                   : Demangle(std::string(absl::StripAsciiWhitespace(line.substr(end + 1))));
  if (f.function.empty()) f.function = "??";
  return f;
}

}  // namespace

std::optional<StackThread> ParseCrashTrace(absl::string_view text) {
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  std::optional<StackThread> python, native;
  for (size_t i = 0; i < lines.size(); ++i) {
    const absl::string_view l = absl::StripTrailingAsciiWhitespace(lines[i]);
    const bool current = absl::StartsWith(l, kPyCurrent);
    const bool py = (current || absl::StartsWith(l, kPyThread)) && absl::EndsWith(l, kMostRecent);
    const bool cc = absl::StartsWith(l, kNativeHead) && absl::EndsWith(l, kMostRecent);
    if (!py && !cc) continue;
    StackThread t;
    t.name = std::string(l.substr(0, l.size() - kMostRecent.size() - 1));
    for (size_t k = i + 1; k < lines.size(); ++k) {
      std::optional<StackFrame> f = py ? PythonFrame(lines[k]) : NativeFrame(lines[k]);
      if (!f) break;
      t.frames.push_back(std::move(*f));
    }
    if (t.frames.empty()) continue;
    // The crashing thread: Python's "Current thread", else the last block written.
    if (cc) {
      native = std::move(t);
    } else if (current || !python || !absl::StartsWith(python->name, kPyCurrent)) {
      python = std::move(t);
    }
  }
  // A Python worker's own code is what its user can act on; the native frames are the library's.
  if (python) return python;
  return native;
}

}  // namespace dlrun::launcher
