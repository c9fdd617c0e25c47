#include "launcher/rdzv/rdzv_source.h"

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "launcher/detect/net.h"
#include "launcher/rdzv/rdzv_loader.h"
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

  absl::StatusOr<Assignment> Next() override {
    // The port this node's rank 0 would use, held (not listening) until the next round so no
    // other process takes it before the store binds it.
    port_ = ReservePort("0.0.0.0");
    node_.master_port = port_.port();
    auto a = client_->Join(node_, o_.config.join_timeout);
    if (!a.ok()) return a.status();
    round_ = a->round;
    misses_ = 0;
    a->max_restarts = o_.config.max_restarts;
    a->run_id = o_.run_id;
    a->role = o_.role;
    return *a;
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
      if (++misses_ >= o_.config.heartbeat_misses) {
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

  std::chrono::milliseconds check_interval() const override { return o_.config.heartbeat_interval; }

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
  PortReservation port_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MembershipSource>> MakeRendezvousSource(RdzvSourceOptions o) {
  auto api = LoadRendezvous();
  if (!api.ok()) return api.status();
  auto [host, port] = SplitEndpoint(o.endpoint);
  o.endpoint = absl::StrCat(host, ":", port);
  std::unique_ptr<rdzv::HostedRendezvous> hosted;
  if (o.is_host == "auto" && !CanBind(host, port)) o.is_host = "false";
  if (o.is_host != "false") {
    rdzv::HostOptions h;
    h.config = o.config;
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
