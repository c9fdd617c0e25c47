// The one HOST[:PORT] splitter (rendezvous endpoints, --master-addr's static endpoint, listen
// addresses, node ids). IPv6: "[::1]:29400" and "[::1]" carry brackets, which stay in `host`;
// a bare IPv6 address ("::1", "fe80::2") has no port (it would be ambiguous). No checks of the
// parts: each caller says what it expects.
#pragma once

#include <string>
#include <string_view>

namespace dlrun {

struct HostPort {
  std::string host;  // as written, brackets included
  std::string port;  // the text after the port's ':' (empty: none given)
  bool has_port = false;
};

inline HostPort SplitHostPort(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos) return {std::string(s), "", false};
  const size_t bracket = s.rfind(']');
  const bool bare_v6 = s.find(':') != colon && bracket == std::string_view::npos;
  if (bare_v6 || (bracket != std::string_view::npos && bracket > colon)) {
    return {std::string(s), "", false};
  }
  return {std::string(s.substr(0, colon)), std::string(s.substr(colon + 1)), true};
}

// The other way: "host:port", an IPv6 address bracketed ("::1", 29400 -> "[::1]:29400"); a host
// bracketed already, a name or an IPv4 address as it is.
inline std::string JoinHostPort(std::string_view host, std::string_view port) {
  const bool v6 = host.find(':') != std::string_view::npos && host.front() != '[';
  std::string out;
  out.reserve(host.size() + port.size() + 3);
  if (v6) out += '[';
  out += host;
  if (v6) out += ']';
  out += ':';
  out += port;
  return out;
}
inline std::string JoinHostPort(std::string_view host, int port) {
  return JoinHostPort(host, std::to_string(port));
}

// "[::1]" -> "::1"; anything else as it is.
inline std::string Unbracketed(std::string_view host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return std::string(host.substr(1, host.size() - 2));
  }
  return std::string(host);
}

}  // namespace dlrun
