// gRPC's own log lines, through dlrun's log (spdlog) instead of raw on stderr. A bind that fails
// is dlrun's to say (an agent that cannot host the rendezvous joins the one that does; a server
// that cannot listen is one error line of dlrun's): gRPC's "No address added" and the like go to
// the debug level. Its other errors (a TLS handshake a client failed, at the host) stay warnings,
// prefixed "grpc:"; its info and debug lines, shown only with GRPC_VERBOSITY, stay at debug.
#pragma once

namespace dlrun::rdzv {

// Installs the routing, once per process; every server and client calls it before gRPC logs.
void RouteGrpcLog();

}  // namespace dlrun::rdzv
