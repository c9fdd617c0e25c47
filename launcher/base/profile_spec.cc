#include "launcher/base/profile_spec.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "launcher/base/bad_value.h"

namespace dlrun::launcher {

absl::StatusOr<ProfileTool> ParseProfileTool(const std::string& v) {
  if (v == "nsys") return ProfileTool::kNsys;
  if (v == "py-spy") return ProfileTool::kPySpy;
  if (v == "perf") return ProfileTool::kPerf;
  if (v == "torch") return ProfileTool::kTorch;
  return BadValue("profile", v, "nsys, py-spy, perf or torch");
}

const char* ProfileToolName(ProfileTool t) {
  switch (t) {
    case ProfileTool::kNsys: return "nsys";
    case ProfileTool::kPySpy: return "py-spy";
    case ProfileTool::kPerf: return "perf";
    case ProfileTool::kTorch: return "torch";
    case ProfileTool::kNone: break;
  }
  return "none";
}

absl::StatusOr<StepRange> ParseStepRange(const std::string& v) {
  const std::vector<std::string> parts = absl::StrSplit(v, ':');
  StepRange r;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.first) ||
      !absl::SimpleAtoi(parts[1], &r.last) || r.first < 0 || r.last < r.first) {
    return BadValue("profile-steps", v, "A:B with 0 <= A <= B (e.g. 5:10)");
  }
  return r;
}

absl::StatusOr<std::vector<int>> ParseRankList(const std::string& flag, const std::string& v) {
  std::set<int> ranks;
  auto bad = [&] {
    return BadValue(flag, v, "global ranks such as 1 or 0,2-3");
  };
  if (v.empty()) return bad();
  for (absl::string_view item : absl::StrSplit(v, ',')) {
    const std::vector<absl::string_view> ends = absl::StrSplit(item, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(ends[0], &lo) || lo < 0) return bad();
    hi = lo;
    if (ends.size() == 2 && (!absl::SimpleAtoi(ends[1], &hi) || hi < lo || hi - lo > 100000)) {
      return bad();
    }
    for (int r = lo; r <= hi; ++r) ranks.insert(r);
  }
  return std::vector<int>(ranks.begin(), ranks.end());
}

bool ProfileSpec::Wants(int rank) const {
  return On() && std::binary_search(ranks.begin(), ranks.end(), rank);
}

absl::StatusOr<std::vector<std::string>> SplitProfileArgs(const std::string& v) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char c : v) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) out.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote != 0) return BadValue("profile-args", v, "words with balanced quotes");
  if (in_word) out.push_back(std::move(word));
  return out;
}

}  // namespace dlrun::launcher
