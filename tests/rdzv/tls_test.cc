// Optional mutual TLS for the rendezvous (rendezvous/tls.h), over real gRPC on loopback with the
// test certificates in tests/rdzv/testdata (one job certificate named dlrun-rdzv, its CA, and a
// rogue self-signed certificate with the same name).
#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "dlrun/proto/rendezvous.grpc.pb.h"
#include "gtest/gtest.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"
#include "rendezvous/tls.h"
#include "tests/rdzv/test_client.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::rdzv {
namespace {

constexpr std::chrono::milliseconds kRpc{2000};  // a refused handshake fails within it

std::string Data(const char* name) { return std::string(SOURCE_DIR) + "/tests/rdzv/testdata/" + name; }

TlsConfig Tls(const char* ca, const char* cert, const char* key,
              const std::string& server_name = "dlrun-rdzv") {
  auto c = LoadTlsConfig(Data(ca), Data(cert), Data(key), server_name);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : TlsConfig{};
}

std::unique_ptr<RendezvousServer> StartTlsServer() {
  ServerOptions o;
  o.handler.config.min_nodes = 1;
  o.handler.config.max_nodes = 1;
  o.handler.run_id = "run";
  o.handler.token = "tok";
  o.tls = Tls("ca.pem", "node.pem", "node.key");
  auto s = RendezvousServer::Start(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(RendezvousTls, MutualTlsClientsJoinHeartbeatAndLeave) {
  auto server = StartTlsServer();
  ASSERT_TRUE(server);
  auto client = RendezvousClient::Create(Opts(server->port(), "tok", Tls("ca.pem", "node.pem", "node.key"), kRpc));
  NodeInfo n{"a", "a", "127.0.0.1", 2, -1, 0};
  auto a = client->Join(n, std::chrono::seconds(10));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->assignment.world_size, 2);
  auto hb = client->Heartbeat("a", a->assignment.round);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->action, Action::kContinue);
  ASSERT_TRUE(client->Leave("a", a->assignment.round, true).ok());
  EXPECT_EQ(server->handler().phase(), StateMachine::Phase::kSucceeded);
}

// Each of these must fail at the TLS layer and leave the membership untouched.
TEST(RendezvousTls, ClientsWithoutTheJobsCertificateOrCaGetNowhere) {
  auto server = StartTlsServer();
  ASSERT_TRUE(server);
  struct Case {
    const char* what;
    TlsConfig tls;
  } cases[] = {
      {"plaintext", TlsConfig{}},
      {"a certificate from another CA", Tls("ca.pem", "rogue.pem", "rogue.key")},
      {"trusting another CA", Tls("rogue.pem", "node.pem", "node.key")},
      {"without the server name override", Tls("ca.pem", "node.pem", "node.key", "")},
  };
  for (const Case& c : cases) {
    auto client = RendezvousClient::Create(Opts(server->port(), "tok", c.tls, kRpc));
    NodeInfo n{"intruder", "intruder", "127.0.0.1", 1, -1, 0};
    auto a = client->Join(n, std::chrono::seconds(2));
    ASSERT_FALSE(a.ok()) << c.what;
    // The channel never becomes ready: the join waits for it until its deadline.
    EXPECT_TRUE(a.status().code() == absl::StatusCode::kUnavailable ||
                a.status().code() == absl::StatusCode::kDeadlineExceeded)
        << c.what << ": " << a.status();
    auto st = client->Status();
    EXPECT_FALSE(st.ok()) << c.what;
  }
  auto good = RendezvousClient::Create(Opts(server->port(), "tok", Tls("ca.pem", "node.pem", "node.key"), kRpc));
  auto st = good->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->joined, 0);
  EXPECT_EQ(server->handler().round(), 1u);
}

TEST(RendezvousTls, HalfOrBadConfigurationsGiveOneLineErrors) {
  struct Case {
    std::string ca, cert, key, name;
    const char* expected;
  } cases[] = {
      {"", Data("node.pem"), Data("node.key"), "", "half configured (DLRUN_RDZV_TLS_CA unset)"},
      {Data("ca.pem"), "", "", "", "DLRUN_RDZV_TLS_CERT, DLRUN_RDZV_TLS_KEY unset"},
      {"", "", "", "dlrun-rdzv", "DLRUN_RDZV_TLS_SERVER_NAME='dlrun-rdzv' is set without TLS"},
      {"/nonexistent/ca.pem", Data("node.pem"), Data("node.key"), "",
       "cannot read DLRUN_RDZV_TLS_CA='/nonexistent/ca.pem': expected a readable PEM file"},
      {Data("ca.pem"), Data("node.key"), Data("node.key"), "",
       "holds no PEM CERTIFICATE"},  // key given as the certificate
      {Data("ca.pem"), Data("node.pem"), Data("node.pem"), "", "holds no PEM PRIVATE KEY"},
      {Data("ca.pem"), "/", Data("node.key"), "", "cannot read DLRUN_RDZV_TLS_CERT='/'"},
  };
  for (const Case& c : cases) {
    auto t = LoadTlsConfig(c.ca, c.cert, c.key, c.name);
    ASSERT_FALSE(t.ok()) << c.expected;
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.expected)) << t.status();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  }
  auto none = LoadTlsConfig("", "", "", "");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled());
}

TEST(RendezvousTls, ACertificateThatDoesNotMatchItsKeyFailsToListen) {
  ServerOptions o;
  o.handler.run_id = "run";
  o.handler.token = "tok";
  o.tls = Tls("ca.pem", "node.pem", "rogue.key");
  auto s = RendezvousServer::Start(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "TLS certificate and key do not match"))
      << s.status();
}

}  // namespace
}  // namespace dlrun::rdzv
