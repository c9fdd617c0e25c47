#include "launcher/rdzv_source.h"

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "launcher/net.h"
#include "launcher/rdzv_loader.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

std::pair<std::string, std::string> SplitEndpoint(const std::string& ep) {
  size_t c = ep.rfind(':');
  if (c == std::string::npos) return {ep, "29400"};
  return {ep.substr(0, c), ep.substr(c + 1)};
}

class RdzvSource final : public MembershipSource {
 public:
  RdzvSource(RdzvSourceOptions o, rdzv::Api* api, std::unique_ptr<rdzv::HostedRendezvous> hosted)
      : o_(std::move(o)), api_(api), hosted_(std::move(hosted)) {
    rdzv::ClientOptions c;
    c.endpoint = o_.endpoint;
    c.run_id = o_.run_id;
    c.token = o_.token;
    c.tls = o_.tls;
    client_ = api_->CreateClient(c);
    node_.node_id = absl::StrCat(o_.hostname, ":", getpid());
    node_.hostname = o_.hostname;
    node_.address = o_.local_addr;
    node_.nproc = o_.nproc;
    node_.slurm_node_id = o_.slurm_node_id;
  }

  ~RdzvSource() override {
    if (!hosted_) return;
    // If the job has ended, keep serving a few heartbeats until every node has heard it, so no
    // agent is cut off and mistakes the hosting agent's exit for a lost rendezvous.
    hosted_->WaitForJobEnd(rdzv::Duration(0));
    hosted_->Shutdown();
  }

  absl::StatusOr<NodeAssignment> Next() override {
    node_.master_port = FreeTcpPort("0.0.0.0");  // the port this node's rank 0 would use
    auto a = client_->Join(node_, o_.join_timeout);
    if (!a.ok()) return a.status();
    round_ = a->round;
    misses_ = 0;
    NodeAssignment n;
    n.node_rank = a->node_rank;
    n.num_nodes = a->num_nodes;
    n.rank_offset = a->rank_offset;
    n.world_size = a->world_size;
    n.local_world_size = a->local_world_size;
    n.master_addr = a->master_addr;
    n.master_port = a->master_port;
    n.restart_count = a->restart_count;
    n.max_restarts = o_.max_restarts;
    n.run_id = o_.run_id;
    n.role = o_.role;
    return n;
  }

  bool OnFailure(const std::string& reason) override {
    auto r = client_->ReportFailure(node_.node_id, round_, reason);
    if (absl::IsPermissionDenied(r.status())) {
      // This node was dropped from the round (e.g. declared dead while it could not answer):
      // it is alive, so it joins the next round; a failed job answers the join with the reason.
      spdlog::warn("the rendezvous no longer counts this node ({}): joining the next round",
                   std::string(r.status().message()));
      return true;
    }
    if (!r.ok()) {
      spdlog::error("cannot report the failure to the rendezvous: {}",
                    std::string(r.status().message()));
      return false;
    }
    return !r->restarts_exhausted;
  }

  Verdict Check(std::string* reason) override {
    auto r = client_->Heartbeat(node_.node_id, round_);
    if (!r.ok()) {
      if (++misses_ >= o_.heartbeat_misses) {
        *reason = absl::StrCat("lost the rendezvous at ", o_.endpoint, ": ",
                               std::string(r.status().message()));
        return Verdict::kStop;
      }
      return Verdict::kContinue;
    }
    misses_ = 0;
    *reason = r->reason;
    switch (r->action) {
      case rdzv::Action::kContinue: return Verdict::kContinue;
      case rdzv::Action::kRestart: return Verdict::kRestart;
      case rdzv::Action::kStop: return Verdict::kStop;
      case rdzv::Action::kFinished: return Verdict::kFinished;
    }
    return Verdict::kContinue;
  }

  std::chrono::milliseconds check_interval() const override { return o_.heartbeat_interval; }

  void OnSuccess() override {
    if (auto s = client_->Leave(node_.node_id, round_, true); !s.ok()) {
      spdlog::warn("leave: {}", std::string(s.message()));
    }

  }

 private:
  RdzvSourceOptions o_;
  rdzv::Api* api_;
  std::unique_ptr<rdzv::HostedRendezvous> hosted_;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  rdzv::NodeInfo node_;
  uint64_t round_ = 0;
  int misses_ = 0;
};

}  // namespace

absl::Status ApplyRdzvConf(const std::string& conf, RdzvSourceOptions* o) {
  for (absl::string_view item : absl::StrSplit(conf, ',', absl::SkipEmpty())) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid item '", item, "' in --rdzv-conf: expected KEY=VALUE"));
    }
    const std::string& k = kv[0];
    const std::string& v = kv[1];
    double secs = 0;
    auto seconds = [&](std::chrono::milliseconds* out) {
      if (!absl::SimpleAtod(v, &secs) || secs <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("invalid value '", v, "' for ", k,
                                                       " in --rdzv-conf: expected seconds > 0"));
      }
      *out = std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
      return absl::OkStatus();
    };
    absl::Status s;
    std::chrono::milliseconds ignored;
    if (k == "join_timeout") {
      s = seconds(&o->join_timeout);
    } else if (k == "last_call_timeout") {
      s = seconds(&o->last_call);
    } else if (k == "heartbeat_interval") {
      s = seconds(&o->heartbeat_interval);
    } else if (k == "close_timeout" || k == "read_timeout" || k == "timeout") {
      s = seconds(&ignored);  // accepted for torchrun compatibility
    } else if (k == "heartbeat_misses") {
      if (!absl::SimpleAtoi(v, &o->heartbeat_misses) || o->heartbeat_misses < 1) {
        s = absl::InvalidArgumentError(absl::StrCat(
            "invalid value '", v, "' for heartbeat_misses in --rdzv-conf: expected >= 1"));
      }
    } else if (k == "is_host") {
      if (v == "1" || v == "true" || v == "True") {
        o->is_host = "true";
      } else if (v == "0" || v == "false" || v == "False") {
        o->is_host = "false";
      } else {
        s = absl::InvalidArgumentError(absl::StrCat(
            "invalid value '", v, "' for is_host in --rdzv-conf: expected true or false"));
      }
    } else {
      s = absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", k, "' in --rdzv-conf: expected join_timeout, last_call_timeout, "
          "close_timeout, read_timeout, heartbeat_interval, heartbeat_misses or is_host"));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MembershipSource>> MakeRendezvousSource(RdzvSourceOptions o) {
  auto api = LoadRendezvous();
  if (!api.ok()) return api.status();
  auto [host, port] = SplitEndpoint(o.endpoint);
  o.endpoint = absl::StrCat(host, ":", port);
  std::unique_ptr<rdzv::HostedRendezvous> hosted;
  if (o.is_host == "auto" && !CanBind(host, port)) o.is_host = "false";
  if (o.is_host != "false") {
    rdzv::HostOptions h;
    h.config.min_nodes = o.min_nodes;
    h.config.max_nodes = o.max_nodes;
    h.config.max_restarts = o.max_restarts;
    h.config.join_timeout = o.join_timeout;
    h.config.last_call = o.last_call;
    h.config.heartbeat_interval = o.heartbeat_interval;
    h.config.heartbeat_misses = o.heartbeat_misses;
    h.config.expected_hosts = o.expected_hosts;
    h.run_id = o.run_id;
    h.token = o.token;
    h.tls = o.tls;
    // Bind the endpoint's own address (not 0.0.0.0): if it is not ours, binding fails and this
    // agent is a client only.
    h.listen_address = o.endpoint;
    auto s = (*api)->Host(h);
    if (s.ok()) {
      hosted = std::move(*s);
      spdlog::info("hosting the rendezvous on {}{}", o.endpoint,
                   o.tls.enabled() ? " (mutual TLS)" : "");
    } else if (o.is_host == "true") {
      return s.status();
    }
  }
  return std::unique_ptr<MembershipSource>(new RdzvSource(std::move(o), *api, std::move(hosted)));
}

}  // namespace dlrun::launcher
