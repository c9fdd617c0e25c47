// Grouping ranks by stack, and the report's JSON and text (stacks.h); the tools' output is
// parsed in stack_parse.cc.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "launcher/stacks/json_fields.h"
#include "launcher/stacks/stacks.h"
#include "nlohmann/json.hpp"

namespace dlrun::launcher {

using nlohmann::json;

std::string StackFrame::Render() const {
  if (line > 0) return absl::StrCat(file, ":", line, " ", function);
  if (!file.empty()) return absl::StrCat(function, " (", file, ")");
  return function;
}

std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

namespace {

std::vector<std::string> MainFrames(const RankStack& r) {
  std::vector<std::string> out;
  if (r.threads.empty()) return out;
  for (const StackFrame& f : r.threads.front().frames) out.push_back(f.Render());
  return out;
}

}  // namespace

StackReport GroupStacks(std::vector<RankStack> ranks) {
  StackReport r;
  std::sort(ranks.begin(), ranks.end(),
            [](const RankStack& a, const RankStack& b) { return a.rank < b.rank; });
  std::map<std::vector<std::string>, size_t> index;
  for (const RankStack& s : ranks) {
    if (!s.missing.empty()) continue;
    std::vector<std::string> frames = MainFrames(s);
    auto [it, added] = index.emplace(frames, r.groups.size());
    if (added) r.groups.push_back({{}, {}, std::move(frames)});
    StackGroup& g = r.groups[it->second];
    g.ranks.push_back(s.rank);
    if (std::find(g.hosts.begin(), g.hosts.end(), s.host) == g.hosts.end()) {
      g.hosts.push_back(s.host);
    }
  }
  // Ranks are sorted, so among equal sizes the group holding the lowest rank comes first.
  std::stable_sort(r.groups.begin(), r.groups.end(), [](const StackGroup& a, const StackGroup& b) {
    return a.ranks.size() > b.ranks.size();
  });
  for (size_t i = 1; i < r.groups.size(); ++i) {
    r.suspects.insert(r.suspects.end(), r.groups[i].ranks.begin(), r.groups[i].ranks.end());
  }
  std::sort(r.suspects.begin(), r.suspects.end());
  std::reverse(r.groups.begin(), r.groups.end());  // smallest first
  r.ranks = std::move(ranks);
  return r;
}

namespace {

json FrameJson(const StackFrame& f) {
  return json{{"function", f.function}, {"file", f.file}, {"line", f.line}};
}

json RankJson(const RankStack& s) {
  json threads = json::array();
  for (const StackThread& t : s.threads) {
    json frames = json::array();
    for (const StackFrame& f : t.frames) frames.push_back(FrameJson(f));
    threads.push_back({{"name", t.name}, {"frames", frames}});
  }
  json j{{"rank", s.rank}, {"local_rank", s.local_rank}, {"host", s.host}, {"pid", s.pid},
         {"tool", s.tool}, {"pause_ms", s.pause_ms}, {"threads", threads}};
  if (!s.missing.empty()) j["missing"] = s.missing;
  return j;
}

}  // namespace

std::string RankStacksJson(const std::vector<RankStack>& ranks) {
  json a = json::array();
  for (const RankStack& s : ranks) a.push_back(RankJson(s));
  return a.dump();
}

std::string RankStacksJson(std::vector<RankStack> ranks, size_t max_bytes) {
  std::string out = RankStacksJson(ranks);
  if (out.size() <= max_bytes) return out;
  for (RankStack& r : ranks) {
    if (r.threads.size() > 1) r.threads.resize(1);
  }
  for (size_t frames = 64;; frames /= 2) {
    for (RankStack& r : ranks) {
      for (StackThread& t : r.threads) {
        if (t.frames.size() > frames) t.frames.resize(frames);
        for (StackFrame& f : t.frames) {
          if (f.function.size() > 160) f.function.resize(160);
          if (f.file.size() > 160) f.file = f.file.substr(f.file.size() - 160);
        }
      }
    }
    out = RankStacksJson(ranks);
    if (out.size() <= max_bytes || frames == 0) return out;
  }
}

absl::StatusOr<std::vector<RankStack>> RankStacksFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("ranks")) j = j["ranks"];
  if (!j.is_array()) return absl::InvalidArgumentError("expected a JSON list of rank stacks");
  std::vector<RankStack> out;
  for (const json& r : j) {
    if (!r.is_object() || Num<int>(r, "rank", -1) < 0) {
      return absl::InvalidArgumentError("a rank stack without a \"rank\" from 0 to 2^31-1");
    }
    RankStack s;
    s.rank = Num<int>(r, "rank", -1);
    s.local_rank = Num<int>(r, "local_rank", -1);
    s.host = Str(r, "host");
    s.pid = Num<int>(r, "pid", -1);
    s.tool = Str(r, "tool");
    s.pause_ms = Num<double>(r, "pause_ms", 0.0);
    s.missing = Str(r, "missing");
    if (r.contains("threads") && r["threads"].is_array()) {
      for (const json& t : r["threads"]) {
        if (!t.is_object()) continue;
        StackThread th;
        th.name = Str(t, "name");
        if (t.contains("frames") && t["frames"].is_array()) {
          for (const json& f : t["frames"]) {
            if (!f.is_object()) continue;
            StackFrame fr;
            fr.function = Str(f, "function", "??");
            fr.file = Str(f, "file");
            fr.line = Num<int>(f, "line", 0);
            th.frames.push_back(std::move(fr));
          }
        }
        s.threads.push_back(std::move(th));
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string StackReportJson(const StackReport& r, int indent) {
  json groups = json::array();
  for (const StackGroup& g : r.groups) {
    groups.push_back({{"ranks", g.ranks}, {"hosts", g.hosts}, {"frames", g.frames}});
  }
  json missing = json::array();
  json ranks = json::array();
  for (const RankStack& s : r.ranks) {
    if (!s.missing.empty()) missing.push_back({{"rank", s.rank}, {"host", s.host}, {"why", s.missing}});
    ranks.push_back(RankJson(s));
  }
  json missing_nodes = json::array();
  for (const auto& [host, why] : r.missing_nodes) {
    missing_nodes.push_back({{"host", host}, {"why", why}});
  }
  json j{{"groups", groups}, {"suspects", r.suspects}, {"missing", missing},
         {"missing_nodes", missing_nodes}, {"took_s", r.took_s}, {"ranks", ranks}};
  if (!r.job.empty()) j["job"] = r.job;
  return j.dump(indent);
}

std::string RanksPhrase(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", RankRanges(ranks));
}

std::string StackSummaryJson(const StackReport& r, const std::string& host, const std::string& why,
                             double when_s, size_t max_bytes) {
  json missing = json::array();
  for (const RankStack& s : r.ranks) {
    if (!s.missing.empty()) missing.push_back({{"rank", s.rank}, {"host", s.host}, {"why", s.missing.substr(0, 200)}});
  }
  for (size_t frames = 8;; frames /= 2) {
    json groups = json::array();
    for (const StackGroup& g : r.groups) {
      json f = json::array();
      for (size_t i = 0; i < g.frames.size() && i < frames; ++i) f.push_back(g.frames[i].substr(0, 200));
      groups.push_back({{"ranks", g.ranks}, {"hosts", g.hosts}, {"frames", f}});
    }
    const json j{{"when_s", when_s}, {"host", host},       {"why", why},
                 {"suspects", r.suspects}, {"missing", missing}, {"groups", groups}};
    std::string out = j.dump();
    if (out.size() <= max_bytes) return out;
    if (frames == 0) {
      return json{{"when_s", when_s}, {"host", host}, {"why", why}, {"suspects", r.suspects},
                  {"truncated", true}}
          .dump()
          .substr(0, max_bytes);
    }
  }
}

std::string FormatStackReport(const StackReport& r) {
  std::set<std::string> hosts;
  for (const RankStack& s : r.ranks) hosts.insert(s.host);
  std::string out = absl::StrFormat("stacks of %d rank(s) on %d node(s) in %.2f s%s\n",
                                    r.ranks.size(), hosts.size(), r.took_s,
                                    r.job.empty() ? "" : absl::StrCat(", job ", r.job));
  std::vector<int> read;
  for (const StackGroup& g : r.groups) read.insert(read.end(), g.ranks.begin(), g.ranks.end());
  // Suspects named by another verdict (the hang detection's step records) may have no stack
  // read: then the stacks do not single them out.
  size_t others = 0, suspects_read = 0;
  for (int rank : read) {
    const bool suspect = std::find(r.suspects.begin(), r.suspects.end(), rank) != r.suspects.end();
    suspects_read += suspect;
    others += !suspect;
  }
  if (!r.suspects.empty() && suspects_read == r.suspects.size() && others > 0) {
    absl::StrAppend(&out, "suspects: ", RanksPhrase(r.suspects), " (the stack differs from ",
                    others, " other rank(s))\n");
  } else if (!r.suspects.empty()) {
    absl::StrAppend(&out, "suspects: ", RanksPhrase(r.suspects),
                    " (named by the hang detection, not by the stacks read)\n");
  } else if (r.groups.size() == 1) {
    absl::StrAppend(&out, "no suspects: every rank read has the same stack\n");
  }
  for (const StackGroup& g : r.groups) {
    absl::StrAppend(&out, "\n", RanksPhrase(g.ranks), " (node ", absl::StrJoin(g.hosts, ", "),
                    "):\n");
    for (const std::string& f : g.frames) absl::StrAppend(&out, "    ", f, "\n");
  }
  for (const RankStack& s : r.ranks) {
    if (s.missing.empty()) continue;
    absl::StrAppend(&out, "\nrank ", s.rank, " (node ", s.host, ", pid ", s.pid,
                    "): not read: ", s.missing, "\n");
  }
  for (const auto& [host, why] : r.missing_nodes) {
    absl::StrAppend(&out, "\nnode ", host, ": not read: ", why, "\n");
  }
  return out;
}

namespace {

bool IsLibraryFile(const std::string& file) {
  return file.empty() || file[0] == '<' || file.find("/site-packages/") != std::string::npos ||
         file.find("/dist-packages/") != std::string::npos ||
         file.find("/lib/python3") != std::string::npos;
}

std::string Basename(const std::string& f) { return f.substr(f.rfind('/') + 1); }

}  // namespace

std::string WhereInProgram(const std::vector<StackFrame>& frames) {
  // py-spy finds no Python frame in an interpreter that is shutting down.
  if (frames.empty()) return "no frames (exiting)";
  for (size_t i = 0; i < frames.size(); ++i) {
    const StackFrame& f = frames[i];
    if (f.line <= 0 || IsLibraryFile(f.file)) continue;
    const std::string at = absl::StrCat(Basename(f.file), ":", f.line);
    if (i == 0) return absl::StrCat(f.function, " at ", at);
    // What it called: the library's outermost function that is not a decorator's wrapper
    // (torch.distributed's collectives are called through one).
    size_t callee = i - 1;
    while (callee > 0 && (absl::StrContains(frames[callee].function, "wrapper") ||
                          absl::StrContains(frames[callee].function, "<locals>"))) {
      --callee;
    }
    return absl::StrCat(frames[callee].function, " at ", at);
  }
  for (const StackFrame& f : frames) {  // else the innermost frame that has a name
    if (f.function != "??") return f.Render();
  }
  return frames.front().Render();
}

std::string WhereTheOthersWere(const StackReport& r, int rank) {
  std::map<std::string, std::vector<int>> where;
  for (const RankStack& s : r.ranks) {
    if (s.rank == rank || !s.missing.empty() || s.threads.empty()) continue;
    where[WhereInProgram(s.threads.front().frames)].push_back(s.rank);
  }
  if (where.empty()) return "";
  int others = 0;
  for (const auto& [w, ranks] : where) others += static_cast<int>(ranks.size());
  if (where.size() == 1) {
    return absl::StrCat("the other ", others, others == 1 ? " rank was in " : " ranks were in ",
                        where.begin()->first);
  }
  std::vector<std::string> parts;
  for (const auto& [w, ranks] : where) {
    parts.push_back(absl::StrCat(RanksPhrase(ranks), " in ", w));
  }
  return absl::StrCat("the other ", others, " ranks were in ", where.size(), " places: ",
                      absl::StrJoin(parts, "; "));
}

absl::Status WriteWorkersFile(FileSystem& fs, const std::string& run_dir, const WorkersFile& w) {
  json workers = json::array();
  for (const DumpTarget& t : w.workers) {
    workers.push_back({{"rank", t.rank}, {"local_rank", t.local_rank}, {"pid", t.pid}});
  }
  json j{{"run_id", w.run_id}, {"host", w.host}, {"agent_pid", w.agent_pid},
         {"attempt", w.attempt}, {"workers", workers}};
  if (!w.rdzv_endpoint.empty()) {
    j["rdzv_endpoint"] = w.rdzv_endpoint;
    j["rdzv_token"] = w.rdzv_token;
  }
  // The job's secret is in it: its owner's alone.
  return fs.Write(absl::StrCat(run_dir, "/", kWorkersFileName), j.dump() + "\n", 0600);
}

absl::StatusOr<WorkersFile> ReadWorkersFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("workers") || !j["workers"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a dlrun workers file (expected {\"workers\": [...]})"));
  }
  WorkersFile w;
  w.run_id = Str(j, "run_id");
  w.host = Str(j, "host");
  w.agent_pid = Num<int>(j, "agent_pid", -1);
  w.attempt = Num<int>(j, "attempt", 0);
  w.rdzv_endpoint = Str(j, "rdzv_endpoint");
  w.rdzv_token = Str(j, "rdzv_token");
  for (const json& t : j["workers"]) {
    if (!t.is_object()) continue;
    w.workers.push_back({Num<int>(t, "rank", -1), Num<int>(t, "local_rank", -1), Num<int>(t, "pid", -1)});
  }
  return w;
}

}  // namespace dlrun::launcher
