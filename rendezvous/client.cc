#include "rendezvous/client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "dlrun/proto/rendezvous.grpc.pb.h"
#include "rendezvous/handler.h"

namespace dlrun::rdzv {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& endpoint, const char* what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    msg = absl::StrCat(what, " to the rendezvous at ", endpoint, ": ", msg);
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

class ClientImpl final : public RendezvousClient {
 public:
  explicit ClientImpl(const ClientOptions& o) : o_(o) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    stub_ = v1::Rendezvous::NewStub(
        grpc::CreateCustomChannel(o.endpoint, grpc::InsecureChannelCredentials(), args));
  }

  absl::StatusOr<Assignment> Join(const NodeInfo& n, Duration timeout) override {
    v1::JoinRequest req;
    FillAuth(req.mutable_auth());
    auto* node = req.mutable_node();
    node->set_node_id(n.node_id);
    node->set_hostname(n.hostname);
    node->set_address(n.address);
    node->set_nproc(n.nproc);
    node->set_slurm_node_id(n.slurm_node_id);
    node->set_master_port(n.master_port);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    ctx.set_wait_for_ready(true);  // the server may not be up yet: wait for it within timeout
    v1::JoinResponse resp;
    absl::Status s = FromGrpc(stub_->Join(&ctx, req, &resp), o_.endpoint, "join");
    if (!s.ok()) return s;
    return FromProto(resp.assignment());
  }

  absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& node_id, uint64_t round) override {
    v1::HeartbeatRequest req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    req.set_round(round);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::HeartbeatResponse resp;
    absl::Status s = FromGrpc(stub_->Heartbeat(&ctx, req, &resp), o_.endpoint, "heartbeat");
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
    return r;
  }

  absl::StatusOr<FailureReply> ReportFailure(const std::string& node_id, uint64_t round,
                                             const std::string& reason) override {
    v1::FailureReport req;
    FillAuth(req.mutable_auth());
    req.set_node_id(node_id);
    req.set_round(round);
    req.set_reason(reason);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::FailureResponse resp;
    absl::Status s = FromGrpc(stub_->ReportFailure(&ctx, req, &resp), o_.endpoint, "report");
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
    return FromGrpc(stub_->Leave(&ctx, req, &resp), o_.endpoint, "leave");
  }

  absl::StatusOr<StatusSnapshot> Status() override {
    v1::StatusRequest req;
    FillAuth(req.mutable_auth());
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::StatusResponse resp;
    absl::Status s = FromGrpc(stub_->Status(&ctx, req, &resp), o_.endpoint, "status");
    if (!s.ok()) return s;
    StatusSnapshot snap;
    snap.round = resp.round();
    snap.phase = resp.state();
    snap.joined = static_cast<int>(resp.joined());
    snap.waiting = static_cast<int>(resp.waiting());
    snap.restart_count = static_cast<int>(resp.restart_count());
    snap.nodes.assign(resp.nodes().begin(), resp.nodes().end());
    return snap;
  }

 private:
  void FillAuth(v1::Auth* a) const {
    a->set_protocol_version(kProtocolVersion);
    a->set_run_id(o_.run_id);
    a->set_token(o_.token);
  }
  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + o_.rpc_timeout);
  }

  ClientOptions o_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
};

}  // namespace

std::unique_ptr<RendezvousClient> RendezvousClient::Create(const ClientOptions& options) {
  return std::make_unique<ClientImpl>(options);
}

}  // namespace dlrun::rdzv
