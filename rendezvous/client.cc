#include "rendezvous/client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "dlrun/proto/rendezvous.grpc.pb.h"
#include "rendezvous/grpc_log.h"
#include "rendezvous/handler.h"
#include "rendezvous/port_probe.h"

namespace dlrun::rdzv {
namespace {

// `channel` says whether a connection ever came up: a join that waited for one in vain reads
// DEADLINE_EXCEEDED, which alone does not tell an unreachable server from a TLS mismatch.
absl::Status FromGrpc(const grpc::Status& s, const std::string& endpoint, const char* what,
                      grpc::Channel* channel, bool tls) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    msg = absl::StrCat(what, " to the rendezvous at ", endpoint, ": ", msg);
    const grpc_connectivity_state state = channel->GetState(false);
    // Never up as gRPC while the port takes TCP connections: something else listens there.
    // What answered is named where it can be: the process on this host, what it said.
    std::optional<std::string> answers;
    if (!tls && (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_CONNECTING)) {
      answers = WhatAnswers(endpoint);
    }
    if (answers) {
      absl::StrAppend(&msg, " (the port answers, but not as a dlrun rendezvous",
                      answers->empty() ? "" : absl::StrCat(": ", *answers),
                      "; another program holds it, or the endpoint names the wrong port)");
    } else if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      absl::StrAppend(&msg, tls ? " (cannot connect: is it up, and does it use this job's TLS "
                                  "CA and certificates?)"
                                : " (cannot connect: is it up, and is the port open?)");
    }
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

RegroupNotice NoticeFromProto(const v1::RegroupNotice& n) {
  RegroupNotice r;
  r.round = n.round();
  r.generation = static_cast<int>(n.generation());
  r.master_port = static_cast<int>(n.master_port());
  for (uint32_t rank : n.lost_ranks()) r.lost_ranks.push_back(static_cast<int>(rank));
  r.reason = n.reason();
  r.asked_by = n.asked_by();
  for (const v1::NodePlace& p : n.places()) {
    r.places.push_back(
        {p.node_id(), static_cast<int>(p.node_rank()), static_cast<int>(p.rank_offset())});
  }
  r.world_size = static_cast<int>(n.world_size());
  r.master_addr = n.master_addr();
  return r;
}

class ClientImpl final : public RendezvousClient {
 public:
  explicit ClientImpl(const ClientOptions& o) : o_(o) {
    RouteGrpcLog();
    grpc::ChannelArguments args;
    // A job-wide stacks answer holds every node's post (each at most kMaxMessageBytes).
    args.SetMaxReceiveMessageSize(kMaxStacksResponseBytes);
    // gRPC's default reconnect backoff starts at 1 s: a failover host that comes up a moment
    // after the survivors first try it would cost them that second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    // gRPC takes this one as the least time a connection attempt gets to finish its handshake
    // (20 s by default), not as a backoff: 100 ms made a fresh channel to a busy host fail
    // ("timed out before receiving SETTINGS frame") under load. A refused connection still
    // retries after the 100 ms above.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (o.tls.enabled()) {
      grpc::SslCredentialsOptions co;
      co.pem_root_certs = o.tls.ca_pem;
      co.pem_private_key = o.tls.key_pem;
      co.pem_cert_chain = o.tls.cert_pem;
      creds = grpc::SslCredentials(co);
      if (!o.tls.server_name.empty()) args.SetSslTargetNameOverride(o.tls.server_name);
    }
    channel_ = grpc::CreateCustomChannel(o.endpoint, creds, args);
    stub_ = v1::Rendezvous::NewStub(channel_);
    job_ = v1::JobChannel::NewStub(channel_);
    regroup_ = v1::Regroup::NewStub(channel_);
  }

  absl::StatusOr<JoinResult> Join(const NodeInfo& n, Duration timeout) override {
    v1::JoinRequest req;
    FillAuth(req.mutable_auth());
    req.set_candidates(o_.candidates);
    if (n.resume.round > 0) {
      auto* r = req.mutable_resume();
      r->set_round(n.resume.round);
      r->set_restart_count(n.resume.restart_count);
      r->set_survivors(n.resume.survivors);
      r->set_lost_host(n.resume.lost_host);
    }
    auto* node = req.mutable_node();
    node->set_node_id(n.node_id);
    node->set_hostname(n.hostname);
    node->set_address(n.address);
    node->set_nproc(n.nproc);
    node->set_slurm_node_id(n.slurm_node_id);
    node->set_master_port(n.master_port);
    node->set_preflight_gflops(n.preflight_gflops);
    node->set_in_process(n.in_process);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    ctx.set_wait_for_ready(true);  // the server may not be up yet: wait for it within timeout
    v1::JoinResponse resp;
    absl::Status s = Check(stub_->Join(&ctx, req, &resp), "join");
    if (!s.ok()) return s;
    JoinResult r;
    r.epoch = resp.epoch();
    r.redirect = resp.redirect();
    if (r.redirect.empty()) r.assignment = FromProto(resp.assignment());
    for (const auto& x : resp.successors()) r.successors.push_back({x.node_id(), x.address()});
    return r;
  }

  absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& node_id, uint64_t round,
                                           bool in_process) override {
    v1::HeartbeatRequest req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    req.set_round(round);
    req.set_in_process(in_process);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + o_.heartbeat_timeout);
    v1::HeartbeatResponse resp;
    absl::Status s = Check(stub_->Heartbeat(&ctx, req, &resp), "heartbeat");
    if (!s.ok()) return s;
    HeartbeatReply r;
    switch (resp.action()) {
      case v1::HeartbeatResponse::CONTINUE: r.action = Action::kContinue; break;
      case v1::HeartbeatResponse::RESTART: r.action = Action::kRestart; break;
      case v1::HeartbeatResponse::FINISHED: r.action = Action::kFinished; break;
      default: r.action = Action::kStop; break;
    }
    r.current_round = resp.current_round();
    r.reason = resp.reason();
    r.epoch = resp.epoch();
    r.redirect = resp.redirect();
    return r;
  }

  absl::StatusOr<DiagnosticsAsk> Publish(const std::string& node_id,
                                         const telemetry::NodeTelemetry* telemetry) override {
    v1::PublishRequest req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    if (telemetry != nullptr) ToProto(*telemetry, req.mutable_telemetry());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + o_.heartbeat_timeout);
    v1::PublishResponse resp;
    absl::Status s = Check(job_->Publish(&ctx, req, &resp), "publish");
    if (!s.ok()) return s;
    DiagnosticsAsk r;
    r.request = resp.diagnostics_request();
    if (resp.has_profile()) {
      ProfileAsk& p = r.profile.emplace();
      p.tool = resp.profile().tool();
      for (uint32_t rank : resp.profile().ranks()) p.ranks.push_back(static_cast<int>(rank));
      p.duration_ms = resp.profile().duration_ms();
      p.args = resp.profile().args();
    }
    return r;
  }

  absl::StatusOr<std::vector<NodeStacksReply>> CollectStacks(Duration timeout,
                                                             const ProfileAsk* profile) override {
    v1::StacksRequest req;
    FillAuth(req.mutable_auth());
    req.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
    if (profile != nullptr) {
      v1::ProfileAsk* p = req.mutable_profile();
      p->set_tool(profile->tool);
      for (int rank : profile->ranks) p->add_ranks(static_cast<uint32_t>(rank));
      p->set_duration_ms(static_cast<uint32_t>(profile->duration_ms));
      p->set_args(profile->args);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout + o_.rpc_timeout);
    v1::StacksResponse resp;
    absl::Status s = Check(job_->CollectDiagnostics(&ctx, req, &resp), "stacks");
    if (!s.ok()) return s;
    std::vector<NodeStacksReply> out;
    for (const v1::NodeStacks& n : resp.nodes()) {
      out.push_back({n.node_id(), n.hostname(), n.ranks_json()});
    }
    for (const v1::NodeStacks& n : resp.missing()) out.push_back({n.node_id(), n.hostname(), ""});
    return out;
  }

  absl::Status PostDiagnostics(uint64_t request_id, const NodeStacksReply& stacks) override {
    v1::PostStacksRequest req;
    FillAuth(req.mutable_auth());
    req.set_request_id(request_id);
    req.mutable_stacks()->set_node_id(stacks.node_id);
    req.mutable_stacks()->set_hostname(stacks.hostname);
    req.mutable_stacks()->set_ranks_json(stacks.ranks_json);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::PostStacksResponse resp;
    return Check(job_->PostDiagnostics(&ctx, req, &resp), "post stacks");
  }

  absl::StatusOr<FailureReply> ReportFailure(const std::string& node_id, uint64_t round,
                                             const std::string& reason, bool fatal,
                                             bool fallback) override {
    v1::FailureReport req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    req.set_round(round);
    req.set_reason(reason);
    req.set_fatal(fatal);
    req.set_fallback(fallback);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::FailureResponse resp;
    absl::Status s = Check(stub_->ReportFailure(&ctx, req, &resp), "report");
    if (!s.ok()) return s;
    return FailureReply{resp.next_round(), resp.restarts_exhausted()};
  }

  absl::Status Leave(const std::string& node_id, uint64_t round, bool success) override {
    v1::LeaveRequest req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    req.set_round(round);
    req.set_success(success);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::LeaveResponse resp;
    return Check(stub_->Leave(&ctx, req, &resp), "leave");
  }

  absl::StatusOr<StatusSnapshot> Status(Duration wait) override {
    v1::StatusRequest req;
    FillAuth(req.mutable_auth());
    grpc::ClientContext ctx;
    if (wait.count() > 0) {
      ctx.set_deadline(std::chrono::system_clock::now() + wait);
      ctx.set_wait_for_ready(true);
    } else {
      SetDeadline(&ctx);
    }
    v1::StatusResponse resp;
    absl::Status s = Check(stub_->Status(&ctx, req, &resp), "status");
    if (!s.ok()) return s;
    StatusSnapshot snap;
    snap.round = resp.round();
    snap.phase = resp.state();
    snap.joined = static_cast<int>(resp.joined());
    snap.waiting = static_cast<int>(resp.waiting());
    snap.restart_count = static_cast<int>(resp.restart_count());
    snap.nodes.assign(resp.nodes().begin(), resp.nodes().end());
    snap.epoch = resp.epoch();
    snap.redirect = resp.redirect();
    return snap;
  }

  absl::StatusOr<RegroupNotice> AskRegroup(const std::string& node_id,
                                           const RegroupAsk& ask) override {
    v1::RegroupRequest req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    req.set_round(ask.round);
    req.set_generation(static_cast<uint32_t>(ask.generation));
    for (int r : ask.lost_ranks) req.add_lost_ranks(static_cast<uint32_t>(r));
    req.set_master_port(static_cast<uint32_t>(ask.master_port));
    req.set_reason(ask.reason);
    grpc::ClientContext ctx;
    // As a heartbeat: a host that cannot answer within an interval is no place to regroup, and
    // the agent waits for the answer before it restarts instead.
    ctx.set_deadline(std::chrono::system_clock::now() + o_.heartbeat_timeout);
    v1::RegroupNotice resp;
    absl::Status s = Check(regroup_->Ask(&ctx, req, &resp), "regroup");
    if (!s.ok()) return s;
    return NoticeFromProto(resp);
  }

  absl::StatusOr<RegroupNotice> WatchRegroup(const std::string& node_id,
                                             const RegroupNotice& known, Duration timeout,
                                             const CancelHook& on_call) override {
    v1::WatchRegroupRequest req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    req.set_round(known.round);
    req.set_generation(static_cast<uint32_t>(known.generation));
    req.set_master_port(static_cast<uint32_t>(known.master_port));
    req.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout + o_.rpc_timeout);
    on_call([&ctx] { ctx.TryCancel(); });
    v1::RegroupNotice resp;
    const grpc::Status gs = regroup_->Watch(&ctx, req, &resp);
    on_call({});
    absl::Status s = Check(gs, "regroup watch");
    if (!s.ok()) return s;
    return NoticeFromProto(resp);
  }

  void set_epoch(uint64_t epoch) override { epoch_.store(epoch); }
  const std::string& endpoint() const override { return o_.endpoint; }

 private:
  void FillAuth(v1::Auth* a) const {
    a->set_protocol_version(kProtocolVersion);
    a->set_run_id(o_.run_id);
    a->set_token(o_.token);
    a->set_epoch(epoch_.load());
  }
  absl::Status Check(const grpc::Status& s, const char* what) const {
    return FromGrpc(s, o_.endpoint, what, channel_.get(), o_.tls.enabled());
  }
  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + o_.rpc_timeout);
  }

  ClientOptions o_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;  // membership
  std::unique_ptr<v1::JobChannel::Stub> job_;    // the job channel, on the same connection
  std::unique_ptr<v1::Regroup::Stub> regroup_;   // in-process recovery across nodes
  std::atomic<uint64_t> epoch_{0};
};

}  // namespace

std::unique_ptr<RendezvousClient> RendezvousClient::Create(const ClientOptions& options) {
  return std::make_unique<ClientImpl>(options);
}

}  // namespace dlrun::rdzv
