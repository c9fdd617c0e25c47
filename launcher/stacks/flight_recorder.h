// PyTorch's Flight Recorder (docs/STACKS.md): every rank's ring of its last collectives, dumped
// to a file per rank when a collective times out. dlrun points the dumps at the attempt's log
// directory (workers/worker_env.cc), reads them after a failure and says where the ranks first
// disagree: the collective some ranks entered and the others never did. No LibTorch here: the
// dump is a Python pickle (protocol 2) of plain dicts, lists and scalars, read by pickle.h's
// small reader; a JSON dump (torch's _dump_fr_trace_json) is read too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/base/file_system.h"
#include "absl/status/statusor.h"
#include "launcher/stacks/pickle.h"
#include "nlohmann/json.hpp"

namespace dlrun::launcher {

// One collective a rank entered, from its dump's "entries".
struct FrEntry {
  std::string group;  // process_group's name ("0" is the default group)
  std::string group_desc;  // and its description ("default_pg")
  int64_t seq = 0;    // collective_seq_id: the n-th collective of that group on this rank
  std::string op;     // profiling_name, e.g. "nccl:all_reduce", "gloo:broadcast"
  std::string state;  // "scheduled", "started", "completed"
  bool p2p = false;
};

struct FrRank {
  int rank = -1;
  std::vector<FrEntry> entries;  // collectives only (p2p left out), in the dump's order
};

// Parses one rank's dump (pickle or JSON) read from `path`; `rank` comes from the file's name
// (prefix + rank).
absl::StatusOr<FrRank> ParseFlightRecorderDump(const std::string& bytes, const std::string& path,
                                               int rank);

// The dumps in `dir` named `<prefix><rank>` (the rest is skipped); unreadable ones go to
// `errors` as "file: why".
std::vector<FrRank> ReadFlightRecorderDir(const FileSystem& fs, const std::string& dir,
                                          const std::string& prefix,
                                          std::vector<std::string>* errors);

struct FrVerdict {
  std::string group, group_desc, op;
  int64_t seq = 0;                    // the first collective the ranks disagree on
  std::vector<int> entered, never_entered;
  std::vector<int> not_completed;     // when every rank entered it: those where it never ended
  std::vector<int> no_dump;           // expected ranks without a dump
  bool agree = false;                 // every dump has the same collectives
  std::string text;                   // one line, e.g. "rank 2 never entered gloo:all_reduce #30
                                      // of group 0 (default_pg); ranks 0-1,3 did"
};

// Where the ranks' histories first part: per group, the lowest collective number some rank
// entered and another (with a dump) never reached; the group where that happened earliest is
// the one named. `expected`: the ranks that should have dumped (missing ones are no_dump).
// nullopt without any dump.
std::optional<FrVerdict> FirstDisagreement(const std::vector<FrRank>& ranks,
                                           const std::vector<int>& expected);

nlohmann::json FrVerdictJson(const FrVerdict& v);

}  // namespace dlrun::launcher
