#include "launcher/rdzv/rdzv_endpoints.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlrun::launcher {
namespace {

std::string CandidateList(const RdzvSourceOptions& o) {
  return o.candidates.size() > 1 ? absl::StrJoin(o.candidates, ",") : "";
}

}  // namespace

// This agent's identity at the rendezvous.
// host:pid/pid-namespace: agents in containers on one host (each the PID 1 of a namespace of its
// own: Slurm's --container, pyxis) must not share an id, and a pid alone does not tell them apart.
std::string NodeId(const RdzvSourceOptions& o) {
  static const std::string pidns = [] {
    std::error_code ec;
    const std::string link = std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
    const size_t open = link.find('['), close = link.find(']');
    if (ec || open == std::string::npos || close == std::string::npos) return std::string();
    return absl::StrCat("/", link.substr(open + 1, close - open - 1));
  }();
  return absl::StrCat(o.hostname, ":", getpid(), pidns);
}

// A client of this job's rendezvous at `endpoint`. A heartbeat slower than one interval counts
// as missed (at least 100 ms, for very short test intervals).
rdzv::ClientOptions ClientFor(const RdzvSourceOptions& o, const std::string& endpoint) {
  rdzv::ClientOptions c;
  c.endpoint = endpoint;
  c.heartbeat_timeout = std::max(rdzv::Duration(100), o.config.heartbeat_interval);
  c.run_id = o.run_id;
  c.token = o.token;
  c.tls = o.tls;
  c.candidates = CandidateList(o);
  return c;
}

// A host of this job's rendezvous at `endpoint` with `epoch`, run by this agent.
rdzv::HostOptions HostFor(const RdzvSourceOptions& o, const std::string& endpoint,
                          uint64_t epoch) {
  rdzv::HostOptions h;
  h.config = o.config;
  h.run_id = o.run_id;
  h.token = o.token;
  h.tls = o.tls;
  h.listen_address = endpoint;
  h.epoch = epoch;
  h.host_node_id = NodeId(o);
  h.candidates = CandidateList(o);
  h.telemetry = o.telemetry;
  return h;
}

// A host of this job already serving at one of `peers` (a node that comes back after the
// job failed over must join it, not host a second one): its endpoint, or empty.
std::string FindServingPeer(rdzv::Api* api, const RdzvSourceOptions& o) {
  for (const std::string& peer : o.peers) {
    if (peer == o.endpoint) continue;
    rdzv::ClientOptions c = ClientFor(o, peer);
    c.rpc_timeout = kPeerProbeTimeout;
    auto st = api->CreateClient(c)->Status();
    if (st.ok() && (st->phase == "running" || st->phase == "joining")) {
      return st->redirect.empty() ? peer : st->redirect;
    }
  }
  return "";
}

}  // namespace dlrun::launcher
