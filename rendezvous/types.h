// Plain types shared by the rendezvous state machine, its handler, service and client.
// No gRPC or protobuf here.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

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
  Duration heartbeat_interval{std::chrono::seconds(5)};
  int heartbeat_misses = 3;  // a node silent for misses x interval is declared dead
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

struct Assignment {
  uint64_t round = 0;
  int node_rank = 0;
  int num_nodes = 0;
  int rank_offset = 0;
  int world_size = 0;
  int local_world_size = 0;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
};

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
