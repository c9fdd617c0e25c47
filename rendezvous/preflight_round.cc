// The preflight's verdict in the rendezvous (docs/USAGE.md "Preflight and bad nodes"): each
// join carries the node's compute probe; a node far under the round's median is left out, or
// fails the job when the round cannot do without it (StateMachine::Close acts on the verdicts):
// pure functions of the nodes' figures.
#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rendezvous/state_machine.h"

namespace dlrun::rdzv {
namespace {

// The preflight's bound: kPreflightSlowRatio x the upper median of the figures given (0: none).
double SlowBound(std::vector<double> figures, double ratio) {
  figures.erase(std::remove(figures.begin(), figures.end(), 0.0), figures.end());
  if (figures.size() < 2) return 0;
  std::sort(figures.begin(), figures.end());
  return ratio * figures[figures.size() / 2];  // the upper median: of two, the faster
}

std::string SlowVerdict(const NodeInfo& n, double bound, double ratio) {
  return absl::StrFormat("node %s: compute probe %.2f GFLOP/s, under %.0f%% of the round's "
                         "median %.2f",
                         n.hostname, n.preflight_gflops, ratio * 100, bound / ratio);
}

// Whether two of `nodes` share a host name: agents on one machine share its CPUs, so their
// probes measure each other, not the machine (tests run several "nodes" on one host).
bool SharesAHost(const std::vector<NodeInfo>& nodes) {
  std::set<std::string> hosts;
  for (const NodeInfo& n : nodes) {
    if (!hosts.insert(n.hostname).second) return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<size_t, std::string>> SlowJoiners(const std::vector<NodeInfo>& joining,
                                                        double ratio) {
  if (SharesAHost(joining)) return {};
  std::vector<double> figures;
  for (const NodeInfo& n : joining) figures.push_back(n.preflight_gflops);
  const double bound = SlowBound(figures, ratio);
  std::vector<std::pair<size_t, std::string>> slow;
  for (size_t i = 0; i < joining.size(); ++i) {
    const NodeInfo& n = joining[i];
    if (n.preflight_gflops > 0 && n.preflight_gflops < bound) {
      slow.emplace_back(i, SlowVerdict(n, bound, ratio));
    }
  }
  return slow;
}

std::optional<std::string> SlowScaleUp(const NodeInfo& joining, const Roster& members,
                                       double slow_ratio) {
  std::vector<NodeInfo> round{joining};  // the joining node first: index 0
  for (const Roster::Member& m : members) round.push_back(m.node);
  const auto slow = SlowJoiners(round, slow_ratio);
  if (slow.empty() || slow.front().first != 0) return std::nullopt;
  return absl::StrCat(kLeftOutByPreflight, slow.front().second);
}

}  // namespace dlrun::rdzv
