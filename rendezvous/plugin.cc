// libdlrun_rdzv.so, the rendezvous plugin the launcher dlopens (launcher/rdzv/rdzv_loader.cc):
// dlrun_rdzv_api() hands it the server, the client, the failover probe and `dlrun rdzv-server`'s
// Serve, behind the proto-free interface of rendezvous/api.h.
#include "rendezvous/api.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "telemetry/metrics_http.h"
#include "rendezvous/server.h"
#include "spdlog/spdlog.h"

namespace dlrun::rdzv {

namespace {

// Starts a server from the launcher's options (hosted or stand-alone alike); refused requests
// are logged as "<who> refused a request from PEER: why".
absl::StatusOr<std::unique_ptr<RendezvousServer>> StartServer(
    const HostOptions& h, std::string who, std::shared_ptr<telemetry::JobTelemetry> telemetry) {
  ServerOptions o;
  o.handler.telemetry = std::move(telemetry);
  o.handler.config = h.config;
  o.handler.run_id = h.run_id;
  o.handler.token = h.token;
  o.handler.epoch = h.epoch;
  o.handler.host_node_id = h.host_node_id;
  o.handler.candidates = h.candidates;
  o.handler.on_refused = [who = std::move(who)](const absl::Status& s, const std::string& peer) {
    spdlog::warn("{} a request from {}: {}", who, peer, std::string(s.message()));
  };
  o.listen_address = h.listen_address;
  o.tls = h.tls;
  return RendezvousServer::Start(std::move(o));
}

// The job's aggregate, whose straggler warnings go to the log.
std::shared_ptr<telemetry::JobTelemetry> MakeTelemetry(const HostOptions& h) {
  telemetry::TelemetryOptions t = h.telemetry;
  if (!t.on_straggler) t.on_straggler = [](const std::string& line) { spdlog::warn("{}", line); };
  return std::make_shared<telemetry::JobTelemetry>(std::move(t));
}

absl::StatusOr<std::unique_ptr<telemetry::MetricsServer>> ServeTelemetry(std::shared_ptr<telemetry::JobTelemetry> t,
                                                              const std::string& addr, int port) {
  auto m = telemetry::StartMetricsServer(std::move(t), addr, port);
  if (!m.ok()) return m.status();
  // Listening on every address: name this host, as a browser elsewhere would reach it.
  std::string host = addr;
  if (addr == "0.0.0.0" || addr == "::" || addr.empty()) {
    char name[256] = {0};
    host = gethostname(name, sizeof name - 1) == 0 && name[0] != 0 ? name : "localhost";
  }
  spdlog::info("job telemetry on http://{}/ (Prometheus: /metrics, JSON: /api/job)",
               JoinHostPort(host, (*m)->port()));
  std::fflush(stdout);
  return m;
}

}  // namespace

int Serve(const HostOptions& h) {
  auto telemetry = MakeTelemetry(h);
  auto server = StartServer(h, "refused", telemetry);
  if (!server.ok()) {
    std::fprintf(stderr, "dlrun rdzv-server: %s\n", std::string(server.status().message()).c_str());
    return 2;
  }
  const std::string host = SplitHostPort(h.listen_address).host;
  spdlog::info("rendezvous listening on {}:{}{}; a node silent for {} ms is declared dead", host,
               (*server)->port(), h.tls.enabled() ? " (mutual TLS)" : "",
               h.config.liveness_limit().count());
  std::fflush(stdout);
  std::unique_ptr<telemetry::MetricsServer> metrics;
  if (h.metrics_port >= 0) {
    auto m = ServeTelemetry(telemetry, h.metrics_addr, h.metrics_port);
    if (!m.ok()) {
      std::fprintf(stderr, "dlrun rdzv-server: %s\n", std::string(m.status().message()).c_str());
      return 2;
    }
    metrics = std::move(*m);
  }
  (*server)->WaitForJobEnd();
  spdlog::info("{}", telemetry::FormatJobReport(telemetry->TakeSnapshot(std::chrono::steady_clock::now()),
                                     (*server)->handler().phase() == StateMachine::Phase::kSucceeded ? 0 : 1));
  const bool ok = (*server)->handler().phase() == StateMachine::Phase::kSucceeded;
  (*server)->Shutdown();
  spdlog::info("job {}", ok ? "finished successfully" : "failed");
  return ok ? 0 : 1;
}

namespace {

class HostedImpl final : public HostedRendezvous {
 public:
  HostedImpl(std::unique_ptr<RendezvousServer> s, const HostOptions& h,
             std::shared_ptr<telemetry::JobTelemetry> t)
      : s_(std::move(s)), h_(h), telemetry_(std::move(t)) {}
  std::shared_ptr<telemetry::JobTelemetry> telemetry() const override { return telemetry_; }
  ~HostedImpl() override { Shutdown(); }
  int port() const override { return s_->port(); }
  void Shutdown() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (prober_.joinable()) prober_.join();
    s_->Shutdown();
  }
  bool WaitForJobEnd(Duration timeout) override { return s_->WaitForJobEnd(timeout); }
  uint64_t epoch() const override { return h_.epoch; }

  void SetPeers(std::vector<std::string> endpoints) override {
    std::lock_guard<std::mutex> l(mu_);
    for (const std::string& e : endpoints) {
      if (e == h_.listen_address || peers_.count(e)) continue;
      ClientOptions c;
      c.endpoint = e;
      c.run_id = h_.run_id;
      c.token = h_.token;
      c.tls = h_.tls;
      c.rpc_timeout = std::max(Duration(100), h_.config.heartbeat_interval);
      peers_[e] = RendezvousClient::Create(c);
    }
    if (!peers_.empty() && !prober_.joinable() && !stopping_) {
      prober_ = std::thread([this] { ProbeLoop(); });
    }
  }

 private:
  // Asks every peer for its epoch, one heartbeat interval apart, until this host steps down.
  void ProbeLoop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stopping_) {
      std::vector<std::pair<std::string, RendezvousClient*>> peers;
      for (auto& [e, c] : peers_) peers.emplace_back(e, c.get());
      l.unlock();
      for (auto& [endpoint, client] : peers) {
        auto st = client->Status();
        if (!st.ok() || st->epoch <= h_.epoch) continue;
        const std::string target = st->redirect.empty() ? endpoint : st->redirect;
        if (s_->handler().StepDown(target, st->epoch)) {
          spdlog::warn("the rendezvous host at {} serves this job with epoch {} (this host: {}): "
                       "stepping down, every node re-joins there", target, st->epoch, h_.epoch);
          std::lock_guard<std::mutex> g(mu_);
          stopping_ = true;  // nothing more to learn
        }
        break;
      }
      l.lock();
      cv_.wait_for(l, h_.config.heartbeat_interval, [this] { return stopping_; });
    }
  }

  std::unique_ptr<RendezvousServer> s_;
  const HostOptions h_;
  std::shared_ptr<telemetry::JobTelemetry> telemetry_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::unique_ptr<RendezvousClient>> peers_;  // guarded by mu_
  std::thread prober_;
};

class ApiImpl final : public Api {
 public:
  int Serve(const HostOptions& h) override { return ::dlrun::rdzv::Serve(h); }
  std::unique_ptr<RendezvousClient> CreateClient(const ClientOptions& o) override {
    return RendezvousClient::Create(o);
  }
  absl::StatusOr<std::unique_ptr<HostedRendezvous>> Host(const HostOptions& h) override {
    auto telemetry = MakeTelemetry(h);
    auto s = StartServer(h, "rendezvous refused", telemetry);
    if (!s.ok()) return s.status();
    return std::unique_ptr<HostedRendezvous>(new HostedImpl(std::move(*s), h, telemetry));
  }
  absl::StatusOr<std::unique_ptr<telemetry::MetricsServer>> ServeMetrics(std::shared_ptr<telemetry::JobTelemetry> t,
                                                              const std::string& addr,
                                                              int port) override {
    return ServeTelemetry(std::move(t), addr, port);
  }
};

}  // namespace

}  // namespace dlrun::rdzv

extern "C" dlrun::rdzv::Api* dlrun_rdzv_api() {
  static dlrun::rdzv::ApiImpl api;
  return &api;
}
