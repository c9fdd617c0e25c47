// Rendezvous host failover, the pure part: who may host after the current host is lost, in
// which order, and how many nodes survive. The protocol (epochs, resumes, redirects, the cases
// it handles) is in docs/FAILOVER.md; rdzv_source.cc carries it out.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/types.h"

namespace dlrun::launcher {

// "host[:port],host[:port],..." -> "host:port" entries (port 29400 when left out). An entry
// that is empty or has a bad port is an error naming it.
absl::StatusOr<std::vector<std::string>> ParseEndpointList(const std::string& value);

// "host:port" -> {host, port}; the port is "29400" when left out.
std::pair<std::string, std::string> SplitEndpoint(const std::string& endpoint);

// What an agent knows when its host stops answering.
struct FailoverView {
  // --rdzv-endpoint a,b,c: the candidates, in that order. Empty: the implicit candidates.
  std::vector<std::string> explicit_list;
  // The implicit candidates: the last round's members in node-rank order (SLURM_NODEID, PMIx
  // rank or pod index order), the host left out (rdzv::StateMachine::Successors), each reached
  // at its address and the rendezvous port.
  std::vector<rdzv::Successor> successors;
  std::string port;        // the rendezvous port (implicit candidates)
  std::string my_node_id;  // this agent's node id
  std::string lost;        // the endpoint that stopped answering (explicit candidates)
};

struct Candidate {
  std::string endpoint;
  bool is_me = false;  // this agent hosts it (implicit: its own successor entry)
};

// The candidates to try, in order: explicit ones from the entry after the lost one onwards
// (wrapping round, the lost one left out), implicit ones in node-rank order. An explicit
// candidate's is_me is false: the agent that can bind it hosts (bind decides). Implicit
// members that share an address (nodes on one machine) give one entry, except that this
// agent's own entry is kept so it hosts when everyone before it is gone.
std::vector<Candidate> FailoverOrder(const FailoverView& v);

// Nodes of the last round still alive when its host is lost: all but the host when the host
// was a member (an agent hosted it: fewer successors than nodes), else all (a stand-alone
// `dlrun rdzv-server`). Above kMaxSuccessors nodes the host is taken to have been a member.
int Survivors(int num_nodes, size_t successors);

}  // namespace dlrun::launcher
