// Plain types shared by the rendezvous state machine, its handler, service and client.
// No gRPC or protobuf here.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/assignment.h"

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
  int max_restarts = 0;
  std::vector<std::string> expected_hosts;  // e.g. from Slurm, for error messages
};

struct NodeInfo {
  std::string node_id;  // stable identity of the agent (default host:pid)
  std::string hostname;
  std::string address;  // becomes MASTER_ADDR if this node gets node rank 0
  int nproc = 1;
  int slurm_node_id = -1;  // SLURM_NODEID when known
  int master_port = 0;     // port this agent reserved for the c10d store
};

// The node's place in a closed round (common/assignment.h, shared with the launcher).
using Assignment = ::dlrun::Assignment;

enum class Action { kContinue, kRestart, kStop, kFinished };

struct HeartbeatReply {
  Action action = Action::kContinue;
  uint64_t current_round = 0;
  std::string reason;
};

struct FailureReply {
  uint64_t next_round = 0;
  bool restarts_exhausted = false;
};

struct StatusSnapshot {
  uint64_t round = 0;
  std::string phase;
  int joined = 0;
  int waiting = 0;
  int restart_count = 0;
  std::vector<std::string> nodes;  // members of the running round, by node rank
};

}  // namespace dlrun::rdzv
