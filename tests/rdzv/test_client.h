// The rendezvous tests' client options: loopback, run "run", token "tok" unless given.
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "rendezvous/client.h"

namespace dlrun::rdzv {

// `rpc_timeout` zero: the client's default.
inline ClientOptions Opts(int port, std::string token = "tok", TlsConfig tls = {},
                          std::chrono::milliseconds rpc_timeout = {}) {
  ClientOptions c;
  c.endpoint = "127.0.0.1:" + std::to_string(port);
  c.run_id = "run";
  c.token = std::move(token);
  c.tls = std::move(tls);
  if (rpc_timeout.count() > 0) c.rpc_timeout = rpc_timeout;
  // Not the agents' 1 s: these tests check what a heartbeat answers, not how fast, and under
  // ThreadSanitizer beside other tests one of 64 clients' heartbeats once took longer
  // (RendezvousGrpc.SixtyFourAgentsThroughTwoRounds, session 40).
  c.heartbeat_timeout = std::chrono::seconds(10);
  return c;
}

}  // namespace dlrun::rdzv
