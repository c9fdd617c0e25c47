#include "launcher/jobgen/shell.h"

#include <random>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace dlrun::launcher {

std::string ShellQuote(const std::string& word) {
  bool safe = !word.empty();
  for (unsigned char c : word) {
    safe = safe && (absl::ascii_isalnum(c) || std::string_view("@%+=:,./_-").find(c) !=
                                                   std::string_view::npos);
  }
  if (safe) return word;
  return absl::StrCat("'", absl::StrReplaceAll(word, {{"'", "'\\''"}}), "'");
}

std::string JoinCommand(const std::vector<std::string>& cmd) {
  std::vector<std::string> q;
  for (const auto& w : cmd) q.push_back(ShellQuote(w));
  return absl::StrJoin(q, " ");
}

std::string RandomHex(int bytes) {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < bytes; ++i) absl::StrAppend(&s, absl::Hex(rd() & 0xff, absl::kZeroPad2));
  return s;
}

}  // namespace dlrun::launcher
