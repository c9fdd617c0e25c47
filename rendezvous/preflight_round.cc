// The preflight's verdict in the rendezvous (docs/USAGE.md "Preflight and bad nodes"): each
// join carries the node's compute probe; a node far under the round's median is left out, or
// fails the job when the round cannot do without it. Part of the StateMachine
// (state_machine.h), in its own file.
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
template <typename T, typename Node>
bool SharesAHost(const std::vector<T>& nodes, Node node_of) {
  std::set<std::string> hosts;
  for (const T& n : nodes) {
    if (!hosts.insert(node_of(n).hostname).second) return true;
  }
  return false;
}

}  // namespace

bool StateMachine::LeaveOutSlowNodes(Deliveries* out) {
  if (SharesAHost(joining_, [](const Pending& p) -> const NodeInfo& { return p.node; })) {
    return true;
  }
  std::vector<double> figures;
  for (const Pending& p : joining_) figures.push_back(p.node.preflight_gflops);
  const double ratio = config_.preflight_slow_ratio;
  const double bound = SlowBound(figures, ratio);
  std::vector<Pending> kept;
  std::vector<std::string> verdicts;
  for (Pending& p : joining_) {
    if (p.node.preflight_gflops <= 0 || p.node.preflight_gflops >= bound) {
      kept.push_back(std::move(p));
      continue;
    }
    verdicts.push_back(SlowVerdict(p.node, bound, ratio));
    out->push_back({std::move(p.cb), absl::FailedPreconditionError(
                                         absl::StrCat(kLeftOutByPreflight, verdicts.back()))});
  }
  joining_ = std::move(kept);
  joining_index_.clear();
  for (size_t i = 0; i < joining_.size(); ++i) joining_index_[joining_[i].node.node_id] = i;
  if (verdicts.empty() || static_cast<int>(joining_.size()) >= config_.min_nodes) return true;
  Fail(absl::StrCat("the preflight found a slow node the round cannot do without (--nnodes needs "
                    "at least ",
                    config_.min_nodes, "): ", absl::StrJoin(verdicts, "; ")),
       out);
  return false;
}

std::optional<std::string> SlowScaleUp(const NodeInfo& joining, const Roster& members,
                                       double slow_ratio) {
  if (joining.preflight_gflops <= 0) return std::nullopt;
  std::vector<NodeInfo> round{joining};
  for (const Roster::Member& m : members) round.push_back(m.node);
  if (SharesAHost(round, [](const NodeInfo& n) -> const NodeInfo& { return n; })) {
    return std::nullopt;
  }
  std::vector<double> figures{joining.preflight_gflops};
  for (const Roster::Member& m : members) figures.push_back(m.node.preflight_gflops);
  const double bound = SlowBound(figures, slow_ratio);
  if (joining.preflight_gflops >= bound) return std::nullopt;
  return absl::StrCat(kLeftOutByPreflight, SlowVerdict(joining, bound, slow_ratio));
}

}  // namespace dlrun::rdzv
