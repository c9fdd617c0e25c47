#include "launcher/rdzv/failover.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/defaults.h"
#include "common/host_port.h"
#include "launcher/detect/net.h"

namespace dlrun::launcher {

std::pair<std::string, std::string> SplitEndpoint(const std::string& ep) {
  HostPort hp = SplitHostPort(ep);
  if (!hp.has_port) hp.port = std::to_string(defaults::kRdzvPort);
  return {std::move(hp.host), std::move(hp.port)};
}

absl::StatusOr<std::vector<std::string>> ParseEndpointList(const std::string& value) {
  std::vector<std::string> out;
  for (absl::string_view raw : absl::StrSplit(value, ',')) {
    const std::string entry(absl::StripAsciiWhitespace(raw));
    if (!IsHostPort(entry)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid value '", value, "' for --rdzv-endpoint: entry '", entry,
          "' is not HOST[:PORT] with a port 0-65535 (a list is HOST:PORT,HOST:PORT,...)"));
    }
    const auto [host, port] = SplitEndpoint(entry);
    const std::string ep = JoinHostPort(host, port);
    if (std::find(out.begin(), out.end(), ep) != out.end()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid value '", value,
                                                     "' for --rdzv-endpoint: '", ep,
                                                     "' is listed twice"));
    }
    out.push_back(ep);
  }
  return out;
}

std::vector<Candidate> FailoverOrder(const FailoverView& v) {
  std::vector<Candidate> out;
  if (!v.explicit_list.empty()) {
    const auto& l = v.explicit_list;
    auto it = std::find(l.begin(), l.end(), v.lost);
    const size_t start = it == l.end() ? 0 : static_cast<size_t>(it - l.begin()) + 1;
    for (size_t i = 0; i < l.size(); ++i) {
      const std::string& ep = l[(start + i) % l.size()];
      if (ep != v.lost) out.push_back({ep, false});
    }
    return out;
  }
  for (const rdzv::Successor& s : v.successors) {
    const std::string ep = JoinHostPort(s.address, v.port);
    const bool me = s.node_id == v.my_node_id;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const Candidate& c) {
      return c.endpoint == ep && c.is_me == me;
    });
    if (!seen) out.push_back({ep, me});
  }
  return out;
}

int Survivors(int num_nodes, size_t successors) {
  return successors < static_cast<size_t>(num_nodes) ? num_nodes - 1 : num_nodes;
}

}  // namespace dlrun::launcher
