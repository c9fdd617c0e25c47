#include "launcher/detect/hostlist.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dlrun::launcher {
namespace {

absl::Status Bad(const std::string& list, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid hostlist '", list, "': ", why,
                   " (expected e.g. node[001-004,007],gpu-a[1-2])"));
}

// Expands one comma-free item with any number of [..] groups.
absl::Status ExpandItem(const std::string& list, const std::string& item, size_t max_hosts,
                        std::vector<std::string>* out) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < item.size()) {
    size_t open = item.find('[', i);
    const std::string literal = item.substr(i, open == std::string::npos ? open : open - i);
    if (literal.find(']') != std::string::npos) return Bad(list, "']' without '['");
    for (std::string& p : partial) p += literal;
    if (open == std::string::npos) break;
    size_t close = item.find(']', open);
    if (close == std::string::npos) return Bad(list, "'[' without ']'");
    const std::string body = item.substr(open + 1, close - open - 1);
    if (body.empty() || body.find('[') != std::string::npos) return Bad(list, "empty or nested []");
    std::vector<std::string> suffixes;
    for (absl::string_view range : absl::StrSplit(body, ',')) {
      std::vector<std::string> lohi = absl::StrSplit(range, absl::MaxSplits('-', 1));
      uint64_t lo = 0, hi = 0;
      for (const std::string& n : lohi) {
        if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 18) {
          return Bad(list, absl::StrCat("'", range, "' is not a number or range"));
        }
      }
      // Digits only, at most 18 of them: the conversions cannot fail, but are checked anyway.
      if (!absl::SimpleAtoi(lohi[0], &lo) ||
          (lohi.size() == 2 && !absl::SimpleAtoi(lohi[1], &hi))) {
        return Bad(list, absl::StrCat("'", range, "' is not a number or range"));
      }
      if (lohi.size() == 1) hi = lo;
      if (hi < lo) return Bad(list, absl::StrCat("range '", range, "' runs backwards"));
      if (hi - lo >= max_hosts) return Bad(list, absl::StrCat("more than ", max_hosts, " hosts"));
      const size_t width = lohi[0].size();
      for (uint64_t v = lo; v <= hi; ++v) {
        std::string s = std::to_string(v);
        if (s.size() < width) s.insert(0, width - s.size(), '0');
        suffixes.push_back(std::move(s));
      }
    }
    if (partial.size() * suffixes.size() > max_hosts) {
      return Bad(list, absl::StrCat("more than ", max_hosts, " hosts"));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * suffixes.size());
    for (const std::string& p : partial) {
      for (const std::string& s : suffixes) next.push_back(p + s);
    }
    partial = std::move(next);
    i = close + 1;
  }
  if (out->size() + partial.size() > max_hosts) {
    return Bad(list, absl::StrCat("more than ", max_hosts, " hosts"));
  }
  for (std::string& p : partial) out->push_back(std::move(p));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(const std::string& hostlist,
                                                        size_t max_hosts) {
  std::vector<std::string> out;
  int depth = 0;
  std::string item;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) return Bad(hostlist, "unbalanced brackets");
    if (c == ',' && depth == 0) {
      if (item.empty()) return Bad(hostlist, "empty host name");
      if (absl::Status s = ExpandItem(hostlist, item, max_hosts, &out); !s.ok()) return s;
      item.clear();
    } else if (c == ' ' || c == '\t' || c == '\n') {
      return Bad(hostlist, "whitespace");
    } else {
      item += c;
    }
  }
  if (depth != 0) return Bad(hostlist, "unbalanced brackets");
  return out;
}

}  // namespace dlrun::launcher
