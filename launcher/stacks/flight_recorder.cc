#include "launcher/stacks/flight_recorder.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/stacks/json_fields.h"
#include "launcher/stacks/pickle.h"
#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {
namespace {

using nlohmann::json;

// A dump is a few MB at most (2,000 entries); a file far larger is not one.
constexpr size_t kMaxDumpBytes = 256u << 20;

}  // namespace

absl::StatusOr<FrRank> ParseFlightRecorderDump(const std::string& bytes, const std::string& path,
                                               int rank) {
  json dump;
  if (!bytes.empty() && bytes[0] == '{') {
    dump = json::parse(bytes, nullptr, false);
    if (dump.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": bad JSON"));
  } else {
    auto p = ReadPickle(bytes);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", p.status().message()));
    dump = *std::move(p);
  }
  if (!dump.is_object() || !dump.contains("entries") || !dump["entries"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a Flight Recorder dump (no \"entries\" list)"));
  }
  FrRank r;
  r.rank = rank;
  for (const json& e : dump["entries"]) {
    if (!e.is_object()) continue;
    FrEntry f;
    f.p2p = Bool(e, "is_p2p", false);
    if (f.p2p) continue;
    f.seq = Num<int64_t>(e, "collective_seq_id", 0);
    f.op = Str(e, "profiling_name", "?");
    f.state = Str(e, "state");
    if (auto pg = e.find("process_group"); pg != e.end() && pg->is_array() && !pg->empty()) {
      if ((*pg)[0].is_string()) f.group = (*pg)[0].get<std::string>();
      if (pg->size() > 1 && (*pg)[1].is_string()) f.group_desc = (*pg)[1].get<std::string>();
    }
    if (f.seq > 0) r.entries.push_back(std::move(f));
  }
  return r;
}

std::vector<FrRank> ReadFlightRecorderDir(const FileSystem& fs, const std::string& dir,
                                          const std::string& prefix,
                                          std::vector<std::string>* errors) {
  std::vector<FrRank> out;
  for (const std::string& name : fs.List(dir, /*recursive=*/false)) {
    int rank = -1;
    if (!absl::StartsWith(name, prefix) ||
        !absl::SimpleAtoi(name.substr(prefix.size()), &rank) || rank < 0) {
      continue;
    }
    const std::string path = absl::StrCat(dir, "/", name);
    absl::StatusOr<std::string> bytes = fs.Read(path, kMaxDumpBytes);
    absl::StatusOr<FrRank> r =
        bytes.ok() ? ParseFlightRecorderDump(*bytes, path, rank) : bytes.status();
    if (r.ok()) {
      out.push_back(*std::move(r));
    } else if (errors) {
      errors->push_back(std::string(r.status().message()));
    }
  }
  std::sort(out.begin(), out.end(), [](const FrRank& a, const FrRank& b) { return a.rank < b.rank; });
  return out;
}

namespace {

// Each group's entries, per rank, by collective number.
using GroupEntries = std::map<std::string, std::map<int, std::map<int64_t, const FrEntry*>>>;

struct Disagreement {
  std::string group;
  int64_t seq = 0;
  size_t order = 0;  // how early the collective is: its position in an entering rank's dump
};

// The earliest collective (by its position in the dumps) that some ranks entered and others
// never did, over all groups; none when every group's ranks reached the same number.
std::optional<Disagreement> EarliestDisagreement(const std::vector<FrRank>& ranks,
                                                 const GroupEntries& groups) {
  std::optional<Disagreement> best;
  for (const auto& [group, by_rank] : groups) {
    // The ranks of this group that dumped: a rank with no entry of it at all never entered any.
    int64_t lowest_top = INT64_MAX, highest_top = 0;
    for (const FrRank& r : ranks) {
      auto it = by_rank.find(r.rank);
      const int64_t top = it == by_rank.end() ? 0 : it->second.rbegin()->first;
      lowest_top = std::min(lowest_top, top);
      highest_top = std::max(highest_top, top);
    }
    if (lowest_top == highest_top) continue;
    const int64_t seq = lowest_top + 1;
    size_t order = SIZE_MAX;
    for (const FrRank& r : ranks) {
      for (size_t i = 0; i < r.entries.size(); ++i) {
        if (r.entries[i].group == group && r.entries[i].seq == seq) order = std::min(order, i);
      }
    }
    if (!best || order < best->order) best = Disagreement{group, seq, order};
  }
  return best;
}

// Every rank entered the same collectives: is the last one unfinished somewhere (NCCL records
// completion; Gloo's entries stay "scheduled")? Fills v's group, op and not_completed.
void FindUnfinished(const GroupEntries& groups, FrVerdict* v) {
  for (const auto& [group, by_rank] : groups) {
    for (const auto& [rank, entries] : by_rank) {
      const FrEntry* last = entries.rbegin()->second;
      if (last->state == "started" || (last->state == "scheduled" && !absl::StartsWith(last->op, "gloo:"))) {
        if (v->not_completed.empty() || v->group == group) {
          v->group = group;
          v->seq = last->seq;
          v->op = last->op;
          v->group_desc = last->group_desc;
          v->not_completed.push_back(rank);
        }
      }
    }
  }
}

}  // namespace

std::optional<FrVerdict> FirstDisagreement(const std::vector<FrRank>& ranks,
                                           const std::vector<int>& expected) {
  if (ranks.empty()) return std::nullopt;
  FrVerdict v;
  std::set<int> have;
  for (const FrRank& r : ranks) have.insert(r.rank);
  for (int e : expected) {
    if (!have.count(e)) v.no_dump.push_back(e);
  }
  GroupEntries groups;
  for (const FrRank& r : ranks) {
    for (const FrEntry& e : r.entries) groups[e.group][r.rank][e.seq] = &e;
  }
  const std::string no_dump =
      v.no_dump.empty() ? "" : absl::StrCat("; no dump from rank(s) ", RankRanges(v.no_dump));
  if (const auto best = EarliestDisagreement(ranks, groups)) {
    v.group = best->group;
    v.seq = best->seq;
    for (const auto& [rank, entries] : groups[v.group]) {
      if (auto it = entries.find(v.seq); it != entries.end()) {
        v.op = it->second->op;
        v.group_desc = it->second->group_desc;
        break;
      }
    }
    for (const FrRank& r : ranks) {
      auto it = groups[v.group].find(r.rank);
      const bool in = it != groups[v.group].end() && it->second.count(v.seq);
      (in ? v.entered : v.never_entered).push_back(r.rank);
    }
    v.text = absl::StrCat(RanksPhrase(v.never_entered), " never entered ", v.op, " #", v.seq,
                          " of group ", v.group, v.group_desc.empty() ? "" : " (" + v.group_desc + ")",
                          "; ", RanksPhrase(v.entered), " did", no_dump);
    return v;
  }
  v.agree = true;
  FindUnfinished(groups, &v);
  if (!v.not_completed.empty()) {
    v.text = absl::StrCat("every rank entered ", v.op, " #", v.seq, " of group ", v.group,
                          "; it never completed on ", RanksPhrase(v.not_completed), no_dump);
  } else {
    v.text = absl::StrCat("the ranks' collective histories agree", no_dump);
  }
  return v;
}

json FrVerdictJson(const FrVerdict& v) {
  json j{{"summary", v.text},     {"group", v.group},
         {"group_desc", v.group_desc}, {"op", v.op},
         {"seq", v.seq},          {"entered", v.entered},
         {"never_entered", v.never_entered}, {"not_completed", v.not_completed},
         {"no_dump", v.no_dump},  {"agree", v.agree}};
  return j;
}

}  // namespace dlrun::launcher
