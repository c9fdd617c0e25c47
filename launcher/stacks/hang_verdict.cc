// NameHung (stacks.h): which ranks of a hung group hold the others up, from their stacks.
#include <sys/syscall.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {
namespace {

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// A frame that waits for the other ranks: Python in torch.distributed (a collective, a store, a
// barrier) or in autograd's engine (DDP's backward waits for its all-reduces there); native in
// Gloo, NCCL, c10d or an all-reduce of dlrun::worker's. Not torch.distributed.elastic: its
// `@record` wraps the whole script (the outermost frame of every rank), and waits for nobody.
bool Waits(const StackFrame& f) {
  if (Contains(f.file, "torch/distributed/elastic/")) return false;
  if (Contains(f.file, "torch/distributed/") || Contains(f.file, "torch/autograd/") ||
      Contains(f.file, "torch/nn/parallel/distributed.py")) {
    return true;
  }
  std::string fn = f.function;
  std::transform(fn.begin(), fn.end(), fn.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* part : {"gloo::", "c10d::", "nccl", "allreduce", "all_reduce", "barrier",
                           "broadcast", "allgather", "all_gather", "reduce_scatter", "alltoall",
                           "all_to_all", "processgroup"}) {
    if (Contains(fn, part)) return true;
  }
  return false;
}

}  // namespace

HangVerdict NameHung(const StackReport& r, const std::vector<int>& stopped) {
  const std::set<int> stopped_set(stopped.begin(), stopped.end());
  // Where, per phrase, who: the culprits' phrases and the waiting ones apart.
  std::map<std::string, std::vector<int>> culprit_at, waiting_at;
  std::vector<int> culprits, unread;
  std::set<std::string> why_unread;  // what kept their stacks from being read
  for (const RankStack& s : r.ranks) {
    if (stopped_set.count(s.rank)) {
      culprits.push_back(s.rank);
      culprit_at["stopped by a signal (SIGSTOP?)"].push_back(s.rank);
      continue;
    }
    if (!s.missing.empty() || s.threads.empty()) {
      unread.push_back(s.rank);
      if (!s.missing.empty()) why_unread.insert(s.missing);
      continue;
    }
    const std::vector<StackFrame>& frames = s.threads.front().frames;
    const bool waits = std::any_of(frames.begin(), frames.end(), Waits);
    (waits ? waiting_at : culprit_at)[WhereInProgram(frames)].push_back(s.rank);
    if (!waits) culprits.push_back(s.rank);
  }
  HangVerdict v;
  std::vector<std::string> parts;
  for (const auto& [where, ranks] : culprit_at) {
    parts.push_back(absl::StrCat(RanksPhrase(ranks), ranks.size() == 1 ? " is " : " are ",
                                 where.rfind("stopped", 0) == 0 ? "" : "in ", where));
  }
  for (const auto& [where, ranks] : waiting_at) {
    parts.push_back(absl::StrCat(RanksPhrase(ranks), ranks.size() == 1 ? " waits in " : " wait in ",
                                 where));
  }
  if (!unread.empty()) {
    // Why, where it is one reason for all (the idle line then says what to install: py-spy).
    parts.push_back(absl::StrCat(RanksPhrase(unread), ": stack not read",
                                 why_unread.size() == 1 ? absl::StrCat(" (", *why_unread.begin(), ")")
                                                        : std::string()));
  }
  v.where = absl::StrJoin(parts, "; ");
  // Everyone busy elsewhere than a collective: the dump cannot tell who holds whom.
  if (!waiting_at.empty() || !stopped_set.empty()) v.culprits = culprits;
  v.all_wait = culprit_at.empty() && !waiting_at.empty();
  std::sort(v.culprits.begin(), v.culprits.end());
  return v;
}

std::vector<int> HoldersBySyscall(const std::map<int, std::string>& blocked_call_by_rank) {
  std::vector<int> holders;
  size_t known = 0;
  for (const auto& [rank, call] : blocked_call_by_rank) {
    std::istringstream in(call);
    std::string first;
    if (!(in >> first)) continue;  // not read: unknown
    ++known;
    long number = -1;
    const bool in_call = absl::SimpleAtoi(first, &number) && number >= 0;
    if (!(in_call && number == SYS_futex)) holders.push_back(rank);  // running, or its own call
  }
  if (holders.empty() || holders.size() == known) return {};
  return holders;
}

}  // namespace dlrun::launcher
