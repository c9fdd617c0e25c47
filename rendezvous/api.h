// The rendezvous as the launcher sees it: no gRPC or protobuf types. The launcher loads the
// implementation (libdlrun_rdzv.so) with dlopen only when it needs it, so `dlrun --standalone`
// does not pay for loading gRPC (about 10 ms of start-up on the development machine).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/client.h"
#include "rendezvous/types.h"

namespace dlrun::rdzv {

// A rendezvous server running inside this process (the agent of node rank 0 hosts one).
class HostedRendezvous {
 public:
  virtual ~HostedRendezvous() = default;
  virtual int port() const = 0;
  virtual void Shutdown() = 0;
  // Waits until the job has ended and every node has heard it; false if `timeout` passed.
  virtual bool WaitForJobEnd(Duration timeout) = 0;
};

struct HostOptions {
  Config config;
  std::string run_id;
  std::string token;
  std::string listen_address;  // host:port (port 0: pick one)
  TlsConfig tls;
};

class Api {
 public:
  virtual ~Api() = default;
  // `dlrun rdzv-server`, with its options parsed by the launcher (launcher/cli/rdzv_server_cli.h):
  // serves until the job ends; returns 0 when it succeeded, 1 when it failed, 2 when the server
  // cannot start.
  virtual int Serve(const HostOptions& options) = 0;
  virtual std::unique_ptr<RendezvousClient> CreateClient(const ClientOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<HostedRendezvous>> Host(const HostOptions& options) = 0;
};

}  // namespace dlrun::rdzv

// The plugin's one exported symbol.
extern "C" dlrun::rdzv::Api* dlrun_rdzv_api();
