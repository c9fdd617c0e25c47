// Parsers of the dump tools' output: py-spy's JSON and eu-stack's text (stacks.h).
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "launcher/stacks/json_fields.h"
#include "launcher/stacks/stacks.h"
#include "nlohmann/json.hpp"

namespace dlrun::launcher {

using nlohmann::json;

absl::StatusOr<std::vector<StackThread>> ParsePySpyJson(const std::string& text, pid_t pid) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return absl::InvalidArgumentError("py-spy printed no JSON thread list");
  std::vector<StackThread> threads;
  for (const json& t : j) {
    if (!t.is_object()) continue;
    StackThread th;
    th.name = Str(t, "thread_name");
    const int64_t tid = Num<int64_t>(t, "os_thread_id", 0);
    if (th.name.empty()) th.name = absl::StrCat("TID ", tid);
    if (t.contains("frames") && t["frames"].is_array()) {
      for (const json& f : t["frames"]) {
        if (!f.is_object()) continue;
        StackFrame fr;
        fr.function = Str(f, "name", "??");
        fr.file = Str(f, "filename");
        fr.line = Num<int>(f, "line", 0);
        th.frames.push_back(std::move(fr));
      }
    }
    const bool main = tid == pid || th.name == "MainThread";
    threads.insert(main ? threads.begin() : threads.end(), std::move(th));
  }
  return threads;
}

bool SetSourceLocation(absl::string_view src, StackFrame* f) {
  std::vector<absl::string_view> parts = absl::StrSplit(src, ':');
  int n = 0;
  if (parts.size() >= 3 && absl::SimpleAtoi(parts[parts.size() - 2], &n) && n > 0) {
    // file:line:column
    f->file = std::string(src.substr(0, src.size() - parts.back().size() -
                                            parts[parts.size() - 2].size() - 2));
    f->line = n;
    return true;
  }
  if (parts.size() >= 2 && absl::SimpleAtoi(parts.back(), &n) && n > 0) {
    f->file = std::string(src.substr(0, src.size() - parts.back().size() - 1));
    f->line = n;
    return true;
  }
  return false;
}

// eu-stack -s -m: "TID n:" then "#k 0xADDR [function] - module" and, with line information, an
// indented "file:line:column" under it.
std::vector<StackThread> ParseEuStack(const std::string& text, pid_t pid) {
  std::vector<StackThread> threads;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "TID ")) {
      absl::ConsumeSuffix(&line, ":");
      StackThread th;
      th.name = absl::StrCat("TID ", line);
      threads.push_back(std::move(th));
      continue;
    }
    if (threads.empty()) continue;
    StackThread& th = threads.back();
    if (absl::StartsWith(line, "#")) {
      // "#0  0x00007f.. clock_nanosleep@GLIBC_2.2.5 - /usr/lib/.../libc.so.6"; a demangled
      // C++ name has spaces, so the module is after the last " - ".
      absl::string_view rest = line;
      for (int word = 0; word < 2; ++word) {  // "#0", the address
        rest = absl::StripLeadingAsciiWhitespace(rest);
        const size_t sp = rest.find(' ');
        rest = sp == absl::string_view::npos ? absl::string_view() : rest.substr(sp);
      }
      rest = absl::StripAsciiWhitespace(rest);
      StackFrame f;
      absl::string_view function = rest;
      if (absl::StartsWith(rest, "- ")) {
        function = "";
        f.file = std::string(rest.substr(2));
      } else if (const size_t dash = rest.rfind(" - "); dash != absl::string_view::npos) {
        function = rest.substr(0, dash);
        f.file = std::string(rest.substr(dash + 3));
      }
      f.module = f.file;
      f.file = f.file.substr(f.file.rfind('/') + 1);
      f.function = function.empty() ? "??" : std::string(function);
      // drop the symbol version: clock_nanosleep@GLIBC_2.2.5
      if (const size_t at = f.function.find('@'); at != std::string::npos && at > 0 &&
          f.function.find('(') == std::string::npos) {
        f.function.resize(at);
      }
      th.frames.push_back(std::move(f));
    } else if (absl::StartsWith(line, "    [") && !th.frames.empty()) {
      // -b: "    [BUILD-ID]@0xLOAD+0xOFFSET", the offset in the module (SymbolizeStacks)
      const size_t plus = line.rfind("+0x");
      uint64_t offset = 0;
      if (plus != absl::string_view::npos &&
          absl::SimpleHexAtoi(line.substr(plus + 3), &offset)) {
        th.frames.back().offset = offset;
      }
    } else if (absl::StartsWith(line, "    ") && !th.frames.empty()) {
      // "    ../sysdeps/unix/sysv/linux/clock_nanosleep.c:71:10"
      SetSourceLocation(absl::StripAsciiWhitespace(line), &th.frames.back());
    }
  }
  // The main thread first (eu-stack lists it first already; a stray order is fixed here).
  std::stable_partition(threads.begin(), threads.end(),
                        [pid](const StackThread& t) { return t.name == absl::StrCat("TID ", pid); });
  return threads;
}

}  // namespace dlrun::launcher
