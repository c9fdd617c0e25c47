// What answers at a rendezvous endpoint that does not speak gRPC (client.cc's error text): a
// plain TCP connection, the first words the program there says unasked (an SSH banner, a
// Redis or SMTP greeting), and, for a port on this host, which process listens on it.
#pragma once

#include <optional>
#include <string>

namespace dlrun::rdzv {

// Nothing: no TCP connection to `endpoint` ("host:port", "[v6]:port") within 300 ms. Otherwise
// what is known of the program that took it: "python3 (pid 812) on this host, which said
// 'SSH-2.0-OpenSSH_9.2'", or "" when it said nothing and is not on this host (or not readable).
std::optional<std::string> WhatAnswers(const std::string& endpoint);

// The process listening on TCP `port` on this host, as "sshd (pid 812)" ("" when none is found
// or /proc does not let us see it): from /proc/net/tcp{,6}'s listening sockets and the
// processes' descriptors.
std::string LocalListener(int port);

}  // namespace dlrun::rdzv
