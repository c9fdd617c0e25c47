// Small socket helpers of the agent.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/host_port.h"

namespace dlrun::launcher {

// A port held for a worker's store: bound with SO_REUSEADDR but not listening, so the store
// (SO_REUSEADDR, as c10d's TCPStore sets it) can bind it while no other process's bind(port 0)
// gets it. Released when destroyed: keep it until the workers that use the port are gone.
class PortReservation {
 public:
  PortReservation() = default;
  PortReservation(PortReservation&& o) noexcept { *this = std::move(o); }
  PortReservation& operator=(PortReservation&& o) noexcept;
  ~PortReservation();
  int port() const { return port_; }

 private:
  friend PortReservation ReservePort(const std::string& addr);
  int fd_ = -1;
  int port_ = 0;
};
PortReservation ReservePort(const std::string& addr);

// Whether this host can listen on host:port (it is one of our addresses and the port is free).
bool CanBind(const std::string& host, const std::string& port);

using dlrun::Unbracketed;  // common/host_port.h

// Whether `endpoint` is one HOST[:PORT] (common/host_port.h's split): a host, and a port 0-65535
// when one is given. The check of --rdzv-endpoint, each entry of the gRPC backend's list and the
// static backend's one.
bool IsHostPort(const std::string& endpoint);

// Whether `host` (a name or an address, IPv6 in brackets or not) resolves; the error names the
// host and the resolver's reason.
absl::Status ResolveHost(const std::string& host);


}  // namespace dlrun::launcher
