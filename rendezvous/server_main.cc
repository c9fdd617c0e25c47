#include "rendezvous/api.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "rendezvous/server.h"
#include "spdlog/spdlog.h"

namespace dlrun::rdzv {
namespace {

constexpr const char* kUsage =
    "usage: dlrun rdzv-server [--host ADDR] [--port P] [--nnodes MIN:MAX] [--run-id ID]\n"
    "                         [--max-restarts N] [--last-call S] [--join-timeout S]\n"
    "                         [--heartbeat-interval S] [--heartbeat-misses K]\n"
    "The job token is read from DLRUN_RDZV_TOKEN (never from the command line).\n";

int Bad(const std::string& msg) {
  std::fprintf(stderr, "dlrun rdzv-server: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int ServerMainImpl(const std::vector<std::string>& args) {
  ServerOptions o;
  std::string host = "127.0.0.1";
  int port = 29400;
  o.handler.run_id = "none";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= args.size()) return Bad(absl::StrCat("unknown flag or missing value: '", a, "'"));
    const std::string v = args[++i];
    double secs = 0;
    int n = 0;
    auto seconds = [&](Duration* out) {
      if (!absl::SimpleAtod(v, &secs) || secs <= 0) return false;
      *out = Duration(static_cast<int64_t>(secs * 1000));
      return true;
    };
    if (a == "--host") {
      host = v;
    } else if (a == "--port") {
      if (!absl::SimpleAtoi(v, &port) || port < 0 || port > 65535) {
        return Bad(absl::StrCat("invalid value '", v, "' for --port: expected 0-65535"));
      }
    } else if (a == "--nnodes") {
      int lo = 0, hi = 0;
      size_t c = v.find(':');
      bool ok = c == std::string::npos
                    ? absl::SimpleAtoi(v, &lo) && (hi = lo, true)
                    : absl::SimpleAtoi(v.substr(0, c), &lo) && absl::SimpleAtoi(v.substr(c + 1), &hi);
      if (!ok || lo < 1 || hi < lo) {
        return Bad(absl::StrCat("invalid value '", v, "' for --nnodes: expected N or MIN:MAX"));
      }
      o.handler.config.min_nodes = lo;
      o.handler.config.max_nodes = hi;
    } else if (a == "--run-id") {
      o.handler.run_id = v;
    } else if (a == "--max-restarts") {
      if (!absl::SimpleAtoi(v, &n) || n < 0) {
        return Bad(absl::StrCat("invalid value '", v, "' for --max-restarts: expected >= 0"));
      }
      o.handler.config.max_restarts = n;
    } else if (a == "--heartbeat-misses") {
      if (!absl::SimpleAtoi(v, &n) || n < 1) {
        return Bad(absl::StrCat("invalid value '", v, "' for --heartbeat-misses: expected >= 1"));
      }
      o.handler.config.heartbeat_misses = n;
    } else if (a == "--last-call") {
      if (!seconds(&o.handler.config.last_call)) return Bad("invalid --last-call: expected seconds > 0");
    } else if (a == "--join-timeout") {
      if (!seconds(&o.handler.config.join_timeout)) {
        return Bad("invalid --join-timeout: expected seconds > 0");
      }
    } else if (a == "--heartbeat-interval") {
      if (!seconds(&o.handler.config.heartbeat_interval)) {
        return Bad("invalid --heartbeat-interval: expected seconds > 0");
      }
    } else {
      return Bad(absl::StrCat("unknown flag '", a, "'\n", kUsage));
    }
  }
  const char* token = std::getenv("DLRUN_RDZV_TOKEN");
  if (token == nullptr || std::string(token).size() < 8) {
    return Bad("DLRUN_RDZV_TOKEN is unset or shorter than 8 characters: set it to the job's "
               "secret token (the same on every node)");
  }
  o.handler.token = token;
  auto tls = TlsConfigFromEnv();
  if (!tls.ok()) return Bad(std::string(tls.status().message()));
  o.tls = std::move(*tls);
  o.listen_address = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host,
                                  ":", port);
  o.handler.on_refused = [](const absl::Status& s, const std::string& peer) {
    spdlog::warn("refused a request from {}: {}", peer, std::string(s.message()));
  };
  const bool o_tls_enabled = o.tls.enabled();
  auto server = RendezvousServer::Start(std::move(o));
  if (!server.ok()) return Bad(std::string(server.status().message()));
  spdlog::info("rendezvous listening on {}:{}{}", host, (*server)->port(),
               o_tls_enabled ? " (mutual TLS)" : "");
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
  int ServerMain(const std::vector<std::string>& args) override { return ServerMainImpl(args); }
  std::unique_ptr<RendezvousClient> CreateClient(const ClientOptions& o) override {
    return RendezvousClient::Create(o);
  }
  absl::StatusOr<std::unique_ptr<HostedRendezvous>> Host(const HostOptions& h) override {
    ServerOptions o;
    o.handler.config = h.config;
    o.handler.run_id = h.run_id;
    o.handler.token = h.token;
    o.handler.on_refused = [](const absl::Status& s, const std::string& peer) {
      spdlog::warn("rendezvous refused a request from {}: {}", peer, std::string(s.message()));
    };
    o.listen_address = h.listen_address;
    o.tls = h.tls;
    auto s = RendezvousServer::Start(std::move(o));
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
