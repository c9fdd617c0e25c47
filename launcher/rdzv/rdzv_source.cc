#include "launcher/rdzv/rdzv_source.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <future>
#include <random>
#include <utility>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/host_port.h"
#include "launcher/base/bad_nodes.h"
#include "launcher/detect/net.h"
#include "launcher/rdzv/failover.h"
#include "launcher/rdzv/rdzv_endpoints.h"
#include "launcher/rdzv/rdzv_job_channel.h"
#include "launcher/rdzv/rdzv_regroup.h"
#include "launcher/rdzv/rdzv_loader.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

// How often a join that is held says what it waits for.
constexpr std::chrono::seconds kProgressEvery{15};
constexpr std::chrono::seconds kFirstProgress{3};

int64_t Ms(rdzv::Duration d) { return d.count(); }

constexpr int kHostAttempts = 6;  // an agent that may host: tries while nobody serves

// Membership from the gRPC rendezvous, with host failover (docs/FAILOVER.md): when the host
// stops answering for the liveness limit, the survivors pick the next candidate, which hosts a
// new epoch, and re-join it with what they know of the job.
class RdzvSource final : public MembershipSource {
 public:
  RdzvSource(RdzvSourceOptions o, rdzv::Api* api, std::unique_ptr<rdzv::HostedRendezvous> hosted,
             Clock& clock)
      : o_(std::move(o)), api_(api), clock_(clock), hosted_(std::move(hosted)),
        regroup_(std::make_shared<RdzvRegroup>(
            [api, o = o_](const std::string& at) { return api->CreateClient(ClientFor(o, at)); },
            NodeId(o_))),
        channel_(std::make_shared<RdzvJobChannel>(NodeId(o_), o_.hostname, o_.run_id, o_.token)) {
    node_.node_id = NodeId(o_);
    node_.hostname = o_.hostname;
    node_.address = o_.local_addr;
    node_.nproc = o_.nproc;
    node_.slurm_node_id = o_.slurm_node_id;
    node_.in_process = o_.in_process;
    if (hosted_) epoch_ = hosted_->epoch();
    SwitchTo(o_.endpoint);
  }

  const std::shared_ptr<RdzvRegroup>& regroup() const { return regroup_; }
  const std::shared_ptr<RdzvJobChannel>& channel() const { return channel_; }

  ~RdzvSource() override {
    regroup_->Stop();  // its held watch first: a server shuts down after its calls end
    channel_->Use(nullptr, nullptr);  // it may outlive this source in a JobLink
    if (!hosted_) return;
    // If the job has ended, keep serving a few heartbeats until every node has heard it, so no
    // agent is cut off and mistakes the hosting agent's exit for a lost rendezvous.
    hosted_->WaitForJobEnd(rdzv::Duration(0));
    hosted_->Shutdown();
  }

  absl::StatusOr<Assignment> Next() override {
    // This node's rank-0 port, held (not listening) until the next round: no one else takes it.
    port_ = ReservePort("0.0.0.0");
    node_.master_port = port_.port();
    if (!redirect_.empty()) {
      spdlog::info("joining the newer rendezvous host at {}", redirect_);
      SwitchTo(redirect_);
      redirect_.clear();
    }
    if (lost_) return FailOver();
    absl::StatusOr<double> gflops = node_.preflight_gflops;  // the preflight: before the first join
    if (o_.preflight) gflops = std::exchange(o_.preflight, nullptr)();
    if (!gflops.ok()) return gflops.status();
    node_.preflight_gflops = *gflops;
    auto a = JoinCurrent(rdzv::ResumeInfo{});
    if (!a.ok() && absl::StrContains(a.status().message(), rdzv::kLeftOutByPreflight)) {
      RecordBadNode(PosixFileSystem(), o_.bad_nodes_files,  // the preflight left it out
                    {o_.hostname, std::time(nullptr), std::string(a.status().message())});
    }
    if (!a.ok() && absl::IsUnavailable(a.status()) && round_ > 0 && CanFailOver()) {
      // The host went away while this node waited in a round: fail over from here.
      spdlog::warn("{}: failing over", std::string(a.status().message()));
      return FailOver();
    }
    return a;
  }

  bool OnFailure(const std::string& reason, bool fatal) override {
    return Report(reason, fatal, /*fallback=*/false);
  }
  bool OnFallback(const std::string& reason) override {
    return Report(reason, /*fatal=*/false, /*fallback=*/true);
  }
  bool Report(const std::string& reason, bool fatal, bool fallback) {
    auto r = client_->ReportFailure(node_.node_id, round_, reason, fatal, fallback);
    if (absl::IsPermissionDenied(r.status())) {
      // This node was dropped from the round (e.g. declared dead while it could not answer):
      // it is alive, so it joins the next round; a failed job answers the join with the reason.
      spdlog::warn("the rendezvous no longer counts this node ({}): joining the next round",
                   std::string(r.status().message()));
      return true;
    }
    if (!r.ok()) {
      if (absl::IsUnavailable(r.status()) && CanFailOver()) {
        spdlog::warn("cannot report the failure: {}; failing over to the next rendezvous host",
                     std::string(r.status().message()));
        lost_ = true;
        return true;
      }
      spdlog::error("cannot report the failure to the rendezvous: {}",
                    std::string(r.status().message()));
      return false;
    }
    return !r->restarts_exhausted;
  }

  Verdict Check(std::string* reason) override {
    if (lost_ || !redirect_.empty()) {
      *reason = lost_reason_;
      return Verdict::kRestart;
    }
    auto r = client_->Heartbeat(node_.node_id, round_, regroup_->in_process());
    const auto now = clock_.Now();
    if (!r.ok()) {
      const auto silent = std::chrono::duration_cast<rdzv::Duration>(now - last_ok_);
      if (silent < o_.config.liveness_limit()) return Verdict::kContinue;
      lost_reason_ = absl::StrCat("the rendezvous host at ", client_->endpoint(),
                                  " has not answered for ", Ms(silent), " ms (",
                                  std::string(r.status().message()), ")");
      if (!CanFailOver()) {
        *reason = lost_reason_;
        return Verdict::kStop;
      }
      lost_ = true;
      *reason = absl::StrCat(lost_reason_, ": failing over");
      return Verdict::kRestart;
    }
    last_ok_ = now;
    Adopt(r->epoch);
    if (rdzv::PublishesAfter(beats_++, node_rank_, num_nodes_)) channel_->Exchange();
    *reason = r->reason;
    if (!r->redirect.empty()) {
      redirect_ = r->redirect;
      return Verdict::kRestart;
    }
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
    channel_->Exchange();  // the final figures, before the leave that may end the job
    if (auto s = client_->Leave(node_.node_id, round_, true); !s.ok()) {
      spdlog::warn("leave: {}", std::string(s.message()));
    }
  }

 private:
  void SwitchTo(const std::string& endpoint) {
    client_ = api_->CreateClient(ClientFor(o_, endpoint));
    client_->set_epoch(epoch_);
    channel_->Use(client_.get(), hosted_.get());
    hosts_seen_.push_back(endpoint);
  }

  void Adopt(uint64_t epoch) {
    if (epoch <= epoch_) return;
    epoch_ = epoch;
    client_->set_epoch(epoch_);
  }

  bool CanFailOver() const {
    if (o_.candidates.size() > 1) return true;
    return !successors_.empty();
  }

  // Joins the current host, following redirects of hosts that stepped down.
  absl::StatusOr<Assignment> JoinCurrent(const rdzv::ResumeInfo& resume) {
    node_.resume = resume;
    for (int hops = 0;; ++hops) {
      auto r = JoinWithProgress();
      if (!r.ok()) return r.status();
      Adopt(r->epoch);
      if (r->redirect.empty()) return Accept(*std::move(r));
      if (hops >= 8) {
        return absl::UnavailableError(absl::StrCat("the rendezvous redirected this node 8 times, "
                                                   "last to ", r->redirect));
      }
      spdlog::info("the rendezvous host at {} stepped down: joining {} (epoch {})",
                   client_->endpoint(), r->redirect, r->epoch);
      SwitchTo(r->redirect);
    }
  }

  // The join is held until the round closes: meanwhile, a line every kProgressEvery says what
  // it waits for, from the host's Status (joined of min_nodes) or why that is not known.
  absl::StatusOr<rdzv::JoinResult> JoinWithProgress() {
    auto joined = std::async(std::launch::async,
                             [this] { return client_->Join(node_, o_.config.join_timeout); });
    const SteadyTime start = clock_.Now();
    // The first line comes early when the host cannot be reached: a port that another program
    // holds is said in seconds, not after the first 15.
    bool first = true;
    while (joined.wait_for(first ? kFirstProgress : kProgressEvery) ==
           std::future_status::timeout) {
      const double waited = std::chrono::duration<double>(clock_.Now() - start).count();
      auto st = client_->Status();
      if (first && st.ok()) {  // reachable: the usual lines, every kProgressEvery
        first = false;
        continue;
      }
      first = false;
      if (!st.ok()) {
        spdlog::info("waiting for the rendezvous at {} ({:.0f} s): {}", client_->endpoint(),
                     waited, std::string(st.status().message()));
      } else if (st->joined < o_.config.min_nodes) {
        spdlog::info("waiting for {} more node(s) at {}, {} of {} joined ({:.0f} s)",
                     o_.config.min_nodes - st->joined, client_->endpoint(), st->joined,
                     o_.config.min_nodes, waited);
      } else {
        spdlog::info("waiting for the round at {} to close ({} joined, {}; {:.0f} s)",
                     client_->endpoint(), st->joined, st->phase, waited);
      }
    }
    return joined.get();
  }

  absl::StatusOr<Assignment> Accept(rdzv::JoinResult r) {
    Assignment a = r.assignment;
    round_ = a.round;
    restart_count_ = a.restart_count;
    num_nodes_ = a.num_nodes;
    node_rank_ = a.node_rank;
    successors_ = std::move(r.successors);
    last_ok_ = clock_.Now();
    lost_ = false;
    if (hosted_) hosted_->SetPeers(PeerEndpoints());
    regroup_->Begin(client_->endpoint(), round_, epoch_);
    a.max_restarts = o_.config.max_restarts;
    a.run_id = o_.run_id;
    a.role = o_.role;
    return a;
  }

  // Where another host of this job may be: asked by a hosting agent for newer epochs.
  std::vector<std::string> PeerEndpoints() const {
    std::vector<std::string> out = o_.candidates;
    const std::string port = SplitEndpoint(o_.endpoint).second;
    for (const auto& s : successors_) out.push_back(JoinHostPort(s.address, port));
    out.insert(out.end(), o_.peers.begin(), o_.peers.end());
    out.insert(out.end(), hosts_seen_.begin(), hosts_seen_.end());
    return out;
  }

  absl::StatusOr<Assignment> FailOver() {
    const std::string lost = client_->endpoint();
    const int survivors = Survivors(num_nodes_, successors_.size());
    if (survivors < o_.config.min_nodes) {
      return absl::UnavailableError(absl::StrCat(
          "rendezvous host lost: ", lost, " stopped answering and ", survivors,
          " node(s) of round ", round_, " are left, below the minimum of ", o_.config.min_nodes,
          " (--nnodes); checkpoints are kept"));
    }
    FailoverView v;
    v.explicit_list = o_.candidates.size() > 1 ? o_.candidates : std::vector<std::string>{};
    v.successors = successors_;
    v.port = SplitEndpoint(o_.endpoint).second;
    v.my_node_id = node_.node_id;
    v.lost = lost;
    rdzv::ResumeInfo resume;
    resume.round = round_;
    resume.restart_count = restart_count_;
    resume.survivors = survivors;
    resume.lost_host = lost;
    std::vector<std::string> tried;
    for (const Candidate& c : FailoverOrder(v)) {
      tried.push_back(c.endpoint);
      const bool explicit_candidate = !v.explicit_list.empty();
      const auto [host, port] = SplitEndpoint(c.endpoint);
      if (c.is_me || (explicit_candidate && CanBind(host, port))) {
        HostAt(c.endpoint);  // if it cannot bind, someone else may have: join it anyway
      }
      SwitchTo(c.endpoint);
      // Wait for the candidate to come up (it notices the loss at about the same time).
      auto st = client_->Status(o_.config.liveness_limit());
      if (!st.ok()) {
        spdlog::warn("rendezvous candidate {} did not answer within {} ms: {}", c.endpoint,
                     Ms(o_.config.liveness_limit()), std::string(st.status().message()));
        continue;
      }
      spdlog::warn("rendezvous host {} lost: joining {} (epoch {}) with {} survivor(s) of round "
                   "{}",
                   lost, c.endpoint, st->epoch, survivors, round_);
      auto a = JoinCurrent(resume);
      node_.resume = {};
      if (a.ok() || absl::IsFailedPrecondition(a.status())) return a;  // joined, or job over
      spdlog::warn("joining rendezvous candidate {}: {}", c.endpoint,
                   std::string(a.status().message()));
    }
    return absl::UnavailableError(absl::StrCat("rendezvous host lost: ", lost,
                                               " stopped answering and no candidate took over "
                                               "(tried ",
                                               tried.empty() ? "none" : absl::StrJoin(tried, ", "),
                                               ")"));
  }

  // Starts hosting at `endpoint` with the next epoch. A failure is logged, not fatal.
  void HostAt(const std::string& endpoint) {
    if (hosted_) {
      hosted_->Shutdown();  // an earlier host of ours that stepped down
      channel_->Use(client_.get(), nullptr);
      hosted_.reset();
    }
    const rdzv::HostOptions h = HostFor(o_, endpoint, epoch_ + 1);
    auto s = api_->Host(h);
    if (!s.ok()) {
      spdlog::warn("cannot host the rendezvous at {}: {}", endpoint,
                   std::string(s.status().message()));
      return;
    }
    hosted_ = std::move(*s);
    channel_->Use(client_.get(), hosted_.get());
    spdlog::warn("taking over the rendezvous at {} (epoch {})", endpoint, h.epoch);
  }

  RdzvSourceOptions o_;
  rdzv::Api* api_;
  Clock& clock_;  // the liveness limit of the host is measured on it
  std::unique_ptr<rdzv::HostedRendezvous> hosted_;
  std::shared_ptr<RdzvRegroup> regroup_;  // in-process recovery across nodes
  std::shared_ptr<RdzvJobChannel> channel_;  // on the current host's client
  std::unique_ptr<rdzv::RendezvousClient> client_;
  rdzv::NodeInfo node_;
  uint64_t round_ = 0;
  int restart_count_ = 0;
  int num_nodes_ = 0, node_rank_ = 0;
  uint64_t beats_ = 0;  // answered heartbeats: the job channel's pace (rdzv::PublishesAfter)
  uint64_t epoch_ = 0;
  std::vector<rdzv::Successor> successors_;
  std::vector<std::string> hosts_seen_;
  SteadyTime last_ok_ = clock_.Now();
  bool lost_ = false;  // the host stopped answering: the next Next() fails over
  std::string lost_reason_;
  std::string redirect_;  // the host stepped down: the next Next() joins here
  PortReservation port_;
};

}  // namespace

absl::StatusOr<JobLink> MakeRendezvousSource(RdzvSourceOptions o) {
  auto api = LoadRendezvous();
  if (!api.ok()) return api.status();
  return MakeRendezvousSource(std::move(o), **api, SystemClock());
}

absl::StatusOr<JobLink> MakeRendezvousSource(RdzvSourceOptions o, rdzv::Api& api_ref,
                                             Clock& clock) {
  rdzv::Api* const api = &api_ref;
  auto [host, port] = SplitEndpoint(o.endpoint);
  o.endpoint = JoinHostPort(host, port);
  std::unique_ptr<rdzv::HostedRendezvous> hosted;
  // Whether the endpoint's address is one of this host's (any port): only then can this agent
  // host, and only then is a busy port worth another look (below).
  const bool local = o.is_host == "auto" && CanBind(host, "0");
  if (o.is_host == "auto" && !local) o.is_host = "false";
  if (o.is_host == "auto") {
    if (std::string serving = FindServingPeer(api, o); !serving.empty()) {
      spdlog::info("the rendezvous of this job is already hosted at {}: joining it", serving);
      o.endpoint = serving;
      o.is_host = "false";
    }
  }
  // Two agents of the job starting together on one host (tests, several agents per node) can
  // each find the port taken by the other's socket of the moment (one's bind probe, the other's
  // server before it listens) and both become clients of a rendezvous nobody hosts. So an
  // agent that could not host looks for a server there, and when none answers it tries again
  // after a random pause, a few times; one of them wins.
  std::mt19937 jitter(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  const int attempts = o.is_host == "auto" ? kHostAttempts : 1;
  for (int attempt = 0; o.is_host != "false" && attempt < attempts; ++attempt) {
    if (attempt > 0) {
      rdzv::ClientOptions c = ClientFor(o, o.endpoint);
      c.rpc_timeout = kPeerProbeTimeout;
      if (api->CreateClient(c)->Status().ok()) break;  // hosted: join it
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::uniform_int_distribution<int>(50, 250)(jitter)));
    }
    if (o.is_host == "auto" && !CanBind(host, port)) continue;
    // Bind the endpoint's own address (not 0.0.0.0): if it is not ours, binding fails and this
    // agent is a client only. The first host of a job has epoch 1.
    auto s = api->Host(HostFor(o, o.endpoint, 1));
    if (s.ok()) {
      hosted = std::move(*s);
      spdlog::info("hosting the rendezvous on {}{}", o.endpoint,
                   o.tls.enabled() ? " (mutual TLS)" : "");
      break;
    }
    if (o.is_host == "true") return s.status();
  }
  auto source = std::make_shared<RdzvSource>(std::move(o), api, std::move(hosted), clock);
  return JobLink{source, source->channel(), source->regroup()};
}

}  // namespace dlrun::launcher
