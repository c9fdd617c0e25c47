// Small socket helpers of the agent.
#pragma once

#include <string>

namespace dlrun::launcher {

// A free TCP port on `addr` (bound and released at once; the caller's process binds it next).
int FreeTcpPort(const std::string& addr);

// Whether this host can listen on host:port (it is one of our addresses and the port is free).
bool CanBind(const std::string& host, const std::string& port);

// The local address used to reach `host` (no packet is sent), or "" if unknown.
std::string LocalAddressFor(const std::string& host);

}  // namespace dlrun::launcher
