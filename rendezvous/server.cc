#include "rendezvous/server.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <thread>

#include "absl/strings/str_cat.h"
#include "dlrun/proto/rendezvous.grpc.pb.h"
#include "rendezvous/grpc_log.h"

namespace dlrun::rdzv {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// A reactor for a call held open (a join until its round closes, a regroup watch) that hears its
// client go away, or the server shut down: `cancel` forgets the held call and says whether it
// was still held, and then this finishes it (else whoever answered it did).
class HeldCallReactor final : public grpc::ServerUnaryReactor {
 public:
  HeldCallReactor(std::function<bool()> cancel, const char* why)
      : cancel_(std::move(cancel)), why_(why) {}
  void OnCancel() override {
    if (cancel_()) Finish(grpc::Status(grpc::StatusCode::CANCELLED, why_));
  }
  void OnDone() override { delete this; }

 private:
  std::function<bool()> cancel_;
  const char* why_;
};

class Service final : public v1::Rendezvous::CallbackService {
 public:
  Service(Handler* h, std::function<void()> on_change) : h_(h), on_change_(std::move(on_change)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override {
    const uint64_t ticket = h_->NewTicket();
    auto* r = new HeldCallReactor([h = h_, node = req->node().node_id(),
                                   ticket] { return h->CancelJoin(node, ticket); },
                                  "join cancelled by the client");
    // Nothing may touch `r` after Join: the round can close inside it and end the call.
    h_->Join(*req, ctx->peer(), ticket, [r, resp](const absl::Status& s, const v1::JoinResponse& jr) {
      if (s.ok()) *resp = jr;
      r->Finish(ToGrpc(s));
    });
    on_change_();  // the timer re-reads the next deadline (e.g. last call)
    return r;
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(h_->Heartbeat(*req, ctx->peer(), resp)));
    if (resp->action() == v1::HeartbeatResponse::STOP ||
        resp->action() == v1::HeartbeatResponse::FINISHED) {
      on_change_();  // WaitForJobEnd waits for every node to have heard the end
    }
    return r;
  }

  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext* ctx,
                                          const v1::FailureReport* req,
                                          v1::FailureResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(h_->ReportFailure(*req, ctx->peer(), resp)));
    on_change_();
    return r;
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(h_->Leave(*req, ctx->peer())));
    on_change_();
    return r;
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                   v1::StatusResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(h_->Status(*req, ctx->peer(), resp)));
    return r;
  }

 private:
  Handler* h_;
  std::function<void()> on_change_;
};

class ChannelService final : public v1::JobChannel::CallbackService {
 public:
  ChannelService(ChannelHandler* c, std::function<void()> on_change)
      : c_(c), on_change_(std::move(on_change)) {}

  grpc::ServerUnaryReactor* Publish(grpc::CallbackServerContext* ctx,
                                    const v1::PublishRequest* req,
                                    v1::PublishResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(c_->Publish(*req, ctx->peer(), resp)));
    return r;
  }

  grpc::ServerUnaryReactor* CollectDiagnostics(grpc::CallbackServerContext* ctx,
                                               const v1::StacksRequest* req,
                                               v1::StacksResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    // Finished by PostDiagnostics or by the timer (Tick) at the timeout; the timer must learn
    // the new deadline.
    c_->CollectDiagnostics(*req, ctx->peer(),
                           [r, resp](const absl::Status& s, const v1::StacksResponse& sr) {
                             if (s.ok()) *resp = sr;
                             r->Finish(ToGrpc(s));
                           });
    on_change_();
    return r;
  }

  grpc::ServerUnaryReactor* PostDiagnostics(grpc::CallbackServerContext* ctx,
                                            const v1::PostStacksRequest* req,
                                            v1::PostStacksResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(c_->PostDiagnostics(*req, ctx->peer())));
    return r;
  }

 private:
  ChannelHandler* c_;
  std::function<void()> on_change_;
};

class RegroupService final : public v1::Regroup::CallbackService {
 public:
  RegroupService(RegroupHandler* g, std::function<void()> on_change)
      : g_(g), on_change_(std::move(on_change)) {}

  grpc::ServerUnaryReactor* Ask(grpc::CallbackServerContext* ctx, const v1::RegroupRequest* req,
                                v1::RegroupNotice* resp) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(g_->Ask(*req, ctx->peer(), resp)));
    return r;
  }

  grpc::ServerUnaryReactor* Watch(grpc::CallbackServerContext* ctx,
                                  const v1::WatchRegroupRequest* req,
                                  v1::RegroupNotice* resp) override {
    const uint64_t ticket = next_ticket_.fetch_add(1);
    // A cancelled watch may make its node lost soon (Handler::WatchEnded): the timer must learn.
    auto* r = new HeldCallReactor(
        [g = g_, ticket, poke = on_change_] {
          const bool held = g->CancelWatch(ticket);
          poke();
          return held;
        },
        "regroup watch cancelled");
    // Finished by an Ask, a new round or the timer (Tick) at the timeout; nothing may touch `r`
    // after Watch. The timer must learn the new deadline.
    g_->Watch(*req, ctx->peer(), ticket,
              [r, resp](const absl::Status& s, const v1::RegroupNotice& n) {
                if (s.ok()) *resp = n;
                r->Finish(ToGrpc(s));
              });
    on_change_();
    return r;
  }

 private:
  RegroupHandler* g_;
  std::function<void()> on_change_;
  std::atomic<uint64_t> next_ticket_{1};
};

std::optional<TimePoint> Earlier(std::optional<TimePoint> a, std::optional<TimePoint> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

class ServerImpl final : public RendezvousServer {
 public:
  explicit ServerImpl(ServerOptions o)
      : ack_grace_(o.handler.config.heartbeat_interval * (2 * o.handler.config.heartbeat_misses)),
        handler_(std::move(o.handler)),
        channel_(handler_),
        regroup_(handler_),
        service_(&handler_, [this] { Poke(); }),
        channel_service_(&channel_, [this] { Poke(); }),
        regroup_service_(&regroup_, [this] { Poke(); }) {}

  absl::Status Init(const std::string& listen, const TlsConfig& tls) {
    RouteGrpcLog();  // a port it cannot bind is this function's error line, not gRPC's
    grpc::ServerBuilder b;
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (tls.enabled()) {
      // Mutual: a client without a certificate signed by the job's CA cannot even send a call.
      grpc::SslServerCredentialsOptions so(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      so.pem_root_certs = tls.ca_pem;
      so.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
      creds = grpc::SslServerCredentials(so);
    }
    b.AddListeningPort(listen, creds, &port_);
    b.RegisterService(&service_);
    b.RegisterService(&channel_service_);
    b.RegisterService(&regroup_service_);
    b.SetMaxReceiveMessageSize(kMaxMessageBytes);
    // gRPC sets SO_REUSEPORT by default: two agents on one host could then both "own" the
    // endpoint. Off, so the second bind fails and that agent becomes a client.
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    server_ = b.BuildAndStart();
    if (!server_ || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", listen,
                       tls.enabled() ? " (address in use or not local, or the TLS certificate "
                                       "and key do not match?)"
                                     : " (address in use or not local?)"));
    }
    timer_ = std::thread([this] { TimerLoop(); });
    return absl::OkStatus();
  }

  ~ServerImpl() override { Shutdown(); }

  int port() const override { return port_; }
  Handler& handler() override { return handler_; }
  ChannelHandler& channel() override { return channel_; }
  RegroupHandler& regroup() override { return regroup_; }

  void Shutdown() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (timer_.joinable()) timer_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  bool WaitForJobEnd(Duration timeout) override {
    auto ended = [this] {
      auto p = handler_.phase();
      return p == StateMachine::Phase::kFailed || p == StateMachine::Phase::kSucceeded;
    };
    std::unique_lock<std::mutex> l(mu_);
    if (timeout == Duration::max()) {
      cv_.wait(l, [&] { return stopping_ || ended(); });
    } else {
      cv_.wait_for(l, timeout, [&] { return stopping_ || ended(); });
    }
    if (!ended()) return false;
    // Then give every node a few heartbeats' time to hear it (a node that died never will).
    cv_.wait_for(l, ack_grace_, [&] { return stopping_ || handler_.EndAcknowledged(); });
    return true;
  }

 private:
  void Poke() {
    {
      std::lock_guard<std::mutex> l(mu_);
      ++changes_;
    }
    cv_.notify_all();
  }

  // Sleeps until the state machine's next deadline or a change, whichever comes first.
  void TimerLoop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stopping_) {
      l.unlock();
      // The membership first: a round it opens ends the regroups' watches at once.
      std::optional<TimePoint> next = handler_.Tick();
      next = Earlier(Earlier(next, channel_.Tick()), regroup_.Tick());
      l.lock();
      cv_.notify_all();  // WaitForJobEnd re-checks the phase
      const uint64_t seen = changes_;
      auto pred = [&] { return stopping_ || changes_ != seen; };
      if (next) {
        cv_.wait_until(l, *next, pred);
      } else {
        cv_.wait(l, pred);
      }
    }
  }

  const Duration ack_grace_;
  Handler handler_;
  ChannelHandler channel_;
  RegroupHandler regroup_;
  Service service_;
  ChannelService channel_service_;
  RegroupService regroup_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread timer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t changes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(ServerOptions options) {
  const std::string listen = options.listen_address;
  const TlsConfig tls = options.tls;
  auto s = std::make_unique<ServerImpl>(std::move(options));
  if (absl::Status st = s->Init(listen, tls); !st.ok()) return st;
  return std::unique_ptr<RendezvousServer>(std::move(s));
}

}  // namespace dlrun::rdzv
