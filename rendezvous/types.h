// Plain types shared by the rendezvous state machine, its handler, service and client.
// No gRPC or protobuf here.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/assignment.h"
#include "common/defaults.h"

namespace dlrun::rdzv {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = std::chrono::milliseconds;

struct Config {
  int min_nodes = 1;
  int max_nodes = 1;
  // Once min_nodes have joined, the round stays open this long for more (torchrun's
  // last_call_timeout). A re-rendezvous closes as soon as every expected node is back.
  Duration last_call{std::chrono::seconds(30)};
  // A round that has not reached min_nodes this long after it opened fails the job.
  Duration join_timeout{std::chrono::seconds(600)};
  // Liveness, the one setting for hosted and stand-alone servers and for the agents: a node
  // silent for heartbeat_misses x heartbeat_interval (default 5 s) is declared dead, and an
  // agent that gets no answer for as long declares the rendezvous lost.
  Duration heartbeat_interval{std::chrono::seconds(1)};
  int heartbeat_misses = 5;
  Duration liveness_limit() const { return heartbeat_interval * heartbeat_misses; }
  // A member that recovers in process whose regroup watch ended (its connection closed: the
  // agent's process is gone) and that is not heard from again within this is lost at once, not
  // after the liveness limit. A live agent watches again within 0.2 s after a failed watch.
  Duration watch_grace{std::chrono::milliseconds(400)};
  // A node admitted into a running round whose members all recover in process waits this long
  // for the new group's port (posted by global rank 0's node; within milliseconds as a rule);
  // after it, the node joins through a new round instead. Meanwhile its silence does not count.
  Duration admit_timeout{std::chrono::seconds(3)};
  int max_restarts = 0;
  std::vector<std::string> expected_hosts;  // e.g. from Slurm, for error messages
  // The hosting agent's node id: it gets node rank 0 (and so MASTER_ADDR) when the nodes have
  // no Slurm/PMIx/pod order; empty for a stand-alone server.
  std::string first_node_id;
  // The preflight (docs/USAGE.md "Preflight and bad nodes"): a joining node whose compute probe
  // is under this fraction of the round's upper median is left out.
  double preflight_slow_ratio = defaults::kPreflightSlowRatio;
};

// How a join left out by the preflight is answered (FAILED_PRECONDITION): the agent that gets
// it records its node as bad (launcher/base/bad_nodes.h) and exits.
inline constexpr char kLeftOutByPreflight[] = "left out by the preflight: ";

// What a survivor tells a new host after the old one was lost (docs/FAILOVER.md).
struct ResumeInfo {
  uint64_t round = 0;  // 0: an ordinary join
  int restart_count = 0;
  int survivors = 0;  // nodes of that round still expected, the lost host left out
  std::string lost_host;
};

struct NodeInfo {
  std::string node_id;  // stable identity of the agent (default host:pid)
  std::string hostname;
  std::string address;  // becomes MASTER_ADDR if this node gets node rank 0
  int nproc = 1;
  int slurm_node_id = -1;  // SLURM_NODEID when known
  int master_port = 0;     // port this agent reserved for the c10d store
  double preflight_gflops = 0;  // the preflight's compute probe (0: none)
  // Its agent recovers in process where the program declares it (not --recovery restart): it
  // may be admitted into a running round (docs/RECOVERY.md, "A node that joins").
  bool in_process = false;
  ResumeInfo resume;       // set on a failover join
};

// A member that may host after the current host (node-rank order, the host left out).
struct Successor {
  std::string node_id;
  std::string address;
};

// At most this many successors travel with each assignment.
inline constexpr size_t kMaxSuccessors = 8;

// `dlrun profile` on a running job: `tool` (py-spy or perf) on these global ranks for
// `duration_ms`, with `args` for the tool.
struct ProfileAsk {
  std::string tool;
  std::vector<int> ranks;
  int64_t duration_ms = 0;
  std::string args;
};

// The node's place in a closed round (common/assignment.h, shared with the launcher).
using Assignment = ::dlrun::Assignment;

enum class Action { kContinue, kRestart, kStop, kFinished };

struct HeartbeatReply {
  Action action = Action::kContinue;
  uint64_t current_round = 0;
  std::string reason;
  uint64_t epoch = 0;
  std::string redirect;  // with kRestart: the host stepped down, re-join there
};

// The job channel's pace (docs/TELEMETRY.md, "Aggregation"). In a job of up to
// kPublishesPerBeat nodes each node publishes after every answered heartbeat; in a larger one
// after every PublishEvery(nodes)-th, in turn by node rank, so the host answers about
// kPublishesPerBeat Publish calls a heartbeat interval whatever the job's size (a Publish per
// node per interval doubled the host's heartbeat load at 4096 nodes: bench/RESULTS.md). The
// figures are cumulative, so a node that publishes less often loses nothing.
inline constexpr int kPublishesPerBeat = 1024;
inline int PublishEvery(int nodes) {
  return nodes <= kPublishesPerBeat ? 1 : (nodes + kPublishesPerBeat - 1) / kPublishesPerBeat;
}
// Whether node `node_rank` of `nodes` publishes after its heartbeat number `beat` (0, 1, ...).
inline bool PublishesAfter(uint64_t beat, int node_rank, int nodes) {
  const int every = PublishEvery(nodes);
  return beat % static_cast<uint64_t>(every) == static_cast<uint64_t>(node_rank % every);
}

// What the job asks of a node, in the answer to its Publish (the job channel).
struct DiagnosticsAsk {
  uint64_t request = 0;  // > 0: post this node's stacks with this id (docs/STACKS.md)
  // With request: a `dlrun profile` instead (docs/PROFILING.md): post profiles.
  std::optional<ProfileAsk> profile;
};

// One node's answer to a job-wide `dlrun stacks` (docs/STACKS.md).
struct NodeStacksReply {
  std::string node_id, hostname;
  std::string ranks_json;  // empty: the node did not answer in time
};

// What a join returns: the assignment, or a redirect to a newer host.
struct JoinResult {
  Assignment assignment;
  uint64_t epoch = 0;
  std::vector<Successor> successors;
  std::string redirect;  // non-empty: no assignment, join this endpoint instead
};

struct FailureReply {
  uint64_t next_round = 0;
  bool restarts_exhausted = false;
};

// A node's place in the group after its membership changed within a round.
struct NodePlace {
  std::string node_id;
  int node_rank = 0;
  int rank_offset = 0;
};

// The running round's nodes changed and every member recovers in process, so the round goes
// on: the survivors of a lost node without it, or the members with a node admitted into the
// round (it takes the state from a peer). Who is in the group and where, for the regroup that
// tells them.
struct Resize {
  uint64_t round = 0;
  std::vector<NodePlace> places;
  int world_size = 0;
  std::string master_addr;
  std::string reason;    // one line
  std::string admitted;  // the node id of the node admitted (empty: a node was lost)
};

// In-process recovery across nodes (proto `service Regroup`; docs/RECOVERY.md): the round's
// latest regroup as the job knows it.
struct RegroupNotice {
  uint64_t round = 0;
  int generation = 0;   // 0: none in this round
  int master_port = 0;  // 0: not posted yet
  std::vector<int> lost_ranks;
  std::string reason;
  std::string asked_by;  // node id
  // Set when a node was lost and the survivors go on in the same round without it: every
  // remaining node's place, the new world size and master address (empty: nothing moved).
  std::vector<NodePlace> places;
  int world_size = 0;
  std::string master_addr;
};

// A node's ask for generation `generation` after losing `lost_ranks` (empty: the node of global
// rank 0 posting `master_port`, the new group's port).
struct RegroupAsk {
  uint64_t round = 0;
  int generation = 0;
  std::vector<int> lost_ranks;
  int master_port = 0;
  std::string reason;
};

struct StatusSnapshot {
  uint64_t round = 0;
  std::string phase;
  int joined = 0;
  int waiting = 0;
  int restart_count = 0;
  std::vector<std::string> nodes;  // members of the running round, by node rank
  uint64_t epoch = 0;
  std::string redirect;  // the host stepped down for this endpoint
};

}  // namespace dlrun::rdzv
