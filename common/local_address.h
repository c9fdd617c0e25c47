// The local address of the route to a host: what the agent advertises to its peers, and what a
// worker binds for Gloo. Shared by the launcher and the worker library.
#pragma once

#include <string>

namespace dlrun {

// The local IPv4 address this host uses to reach `host` (a name or address), or "" when it
// cannot be resolved or routed. No packet is sent (a UDP socket is connected, not written).
std::string LocalAddressFor(const std::string& host);

}  // namespace dlrun
