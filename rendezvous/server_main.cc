#include "rendezvous/api.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "rendezvous/server.h"
#include "spdlog/spdlog.h"

namespace dlrun::rdzv {

namespace {

// Starts a server from the launcher's options (hosted or stand-alone alike); refused requests
// are logged as "<who> refused a request from PEER: why".
absl::StatusOr<std::unique_ptr<RendezvousServer>> StartServer(const HostOptions& h,
                                                              std::string who) {
  ServerOptions o;
  o.handler.config = h.config;
  o.handler.run_id = h.run_id;
  o.handler.token = h.token;
  o.handler.on_refused = [who = std::move(who)](const absl::Status& s, const std::string& peer) {
    spdlog::warn("{} a request from {}: {}", who, peer, std::string(s.message()));
  };
  o.listen_address = h.listen_address;
  o.tls = h.tls;
  return RendezvousServer::Start(std::move(o));
}

}  // namespace

int Serve(const HostOptions& h) {
  auto server = StartServer(h, "refused");
  if (!server.ok()) {
    std::fprintf(stderr, "dlrun rdzv-server: %s\n", std::string(server.status().message()).c_str());
    return 2;
  }
  const std::string host = h.listen_address.substr(0, h.listen_address.rfind(':'));
  spdlog::info("rendezvous listening on {}:{}{}; a node silent for {} ms is declared dead", host,
               (*server)->port(), h.tls.enabled() ? " (mutual TLS)" : "",
               h.config.liveness_limit().count());
  std::fflush(stdout);
  (*server)->WaitForJobEnd();
  const bool ok = (*server)->handler().phase() == StateMachine::Phase::kSucceeded;
  (*server)->Shutdown();
  spdlog::info("job {}", ok ? "finished successfully" : "failed");
  return ok ? 0 : 1;
}

namespace {

class HostedImpl final : public HostedRendezvous {
 public:
  explicit HostedImpl(std::unique_ptr<RendezvousServer> s) : s_(std::move(s)) {}
  int port() const override { return s_->port(); }
  void Shutdown() override { s_->Shutdown(); }
  bool WaitForJobEnd(Duration timeout) override { return s_->WaitForJobEnd(timeout); }

 private:
  std::unique_ptr<RendezvousServer> s_;
};

class ApiImpl final : public Api {
 public:
  int Serve(const HostOptions& h) override { return ::dlrun::rdzv::Serve(h); }
  std::unique_ptr<RendezvousClient> CreateClient(const ClientOptions& o) override {
    return RendezvousClient::Create(o);
  }
  absl::StatusOr<std::unique_ptr<HostedRendezvous>> Host(const HostOptions& h) override {
    auto s = StartServer(h, "rendezvous refused");
    if (!s.ok()) return s.status();
    return std::unique_ptr<HostedRendezvous>(new HostedImpl(std::move(*s)));
  }
};

}  // namespace

}  // namespace dlrun::rdzv

extern "C" dlrun::rdzv::Api* dlrun_rdzv_api() {
  static dlrun::rdzv::ApiImpl api;
  return &api;
}
