// The rendezvous gRPC server: thin callback-API services over Handler (membership) and
// ChannelHandler (the job channel) and RegroupHandler (in-process recovery across nodes), plus the
// timer thread
// that drives the state machine's deadlines. A pending Join holds no thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/handler.h"
#include "rendezvous/job_channel.h"
#include "rendezvous/regroup.h"
#include "rendezvous/tls.h"

namespace dlrun::rdzv {

struct ServerOptions {
  HandlerOptions handler;
  // host:port to listen on; port 0 picks a free one. Bind the job's address, not 0.0.0.0,
  // unless asked.
  std::string listen_address = "127.0.0.1:0";
  // Mutual TLS when enabled (rendezvous/tls.h); plaintext otherwise.
  TlsConfig tls;
};

class RendezvousServer {
 public:
  virtual ~RendezvousServer() = default;
  virtual int port() const = 0;
  virtual Handler& handler() = 0;
  virtual ChannelHandler& channel() = 0;
  virtual RegroupHandler& regroup() = 0;
  // Stops accepting calls, finishes pending ones with UNAVAILABLE, joins the timer thread.
  virtual void Shutdown() = 0;
  // Blocks until the job has failed or succeeded (false if `timeout` passes first), then for
  // at most 2 x heartbeat_misses heartbeat intervals until every node has been told so.
  virtual bool WaitForJobEnd(Duration timeout = Duration::max()) = 0;

  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(ServerOptions options);
};

}  // namespace dlrun::rdzv
