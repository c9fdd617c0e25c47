// The telemetry endpoints' own HTTP server (telemetry/http_server.h) over real loopback
// sockets, and the Prometheus text writer (telemetry/exposition.h). The end-to-end checks with
// a real Prometheus and a real Chromium are in tests/multiproc/dlrun_telemetry_test.cc.
#include "telemetry/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "telemetry/exposition.h"

namespace dlrun::rdzv {
namespace {

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Sends `request` and reads until the server closes.
std::string Exchange(int port, const std::string& request) {
  int fd = Connect(port);
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

struct Served {
  telemetry::HttpServer srv;
  int port = 0;
  Served() {
    srv.Get("/metrics", [](const std::string&, telemetry::HttpResponse* r) { r->set_content("m 1\n", "text/plain"); });
    srv.GetPrefix("/profile/", [](const std::string& rest, telemetry::HttpResponse* r) {
      r->set_content("profile of " + rest, "text/plain");
    });
    auto p = srv.Listen("127.0.0.1", 0);
    EXPECT_TRUE(p.ok()) << p.status();
    port = p.ok() ? *p : 0;
  }
};

TEST(HttpServer, AnswersGetWithLengthAndClosesTheConnection) {
  Served s;
  ASSERT_GT(s.port, 0);
  const std::string r = Exchange(s.port, "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Length: 4\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.size() - 4), "m 1\n");
  const std::string p = Exchange(s.port, "GET /profile/12 HTTP/1.0\r\n\r\n");
  EXPECT_NE(p.find("\r\n\r\nprofile of 12"), std::string::npos) << p;
}

TEST(HttpServer, HeadHasNoBodyUnknownPathIs404OtherMethodsAre405) {
  Served s;
  const std::string head = Exchange(s.port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_NE(head.find("Content-Length: 4\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << head;
  EXPECT_EQ(Exchange(s.port, "GET /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Exchange(s.port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Exchange(s.port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
}

TEST(HttpServer, AnIdleConnectionHoldsUpNoOtherRequest) {
  Served s;
  const int idle = Connect(s.port);  // a browser's preconnect: nothing sent
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Exchange(s.port, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // Stop ends the idle connection instead of waiting for its read timeout.
  const auto t1 = std::chrono::steady_clock::now();
  s.srv.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5));
  char c;
  EXPECT_EQ(recv(idle, &c, 1, 0), 0);
  close(idle);
}

TEST(HttpServer, APortInUseIsAnErrorNamingIt) {
  Served s;
  telemetry::HttpServer second;
  auto p = second.Listen("127.0.0.1", s.port);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(std::to_string(s.port)), std::string::npos) << p.status();
}

TEST(Exposition, FamiliesHaveHelpTypeSortedEscapedLabelsAndSkipEmptyOnes) {
  telemetry::Exposition e;
  telemetry::MetricFamily& g = e.Gauge("g_seconds", "A gauge\\with a backslash");
  g.Add({{"rank", "1"}, {"host", "a\"b\nc"}}).Set(0.7);
  g.Add({{"rank", "1"}, {"host", "a\"b\nc"}}).Set(0.25);  // the same sample again
  e.Gauge("empty", "no samples");
  e.Counter("c_total", "A counter").Add({}).Increment(3);
  EXPECT_EQ(e.Text(),
            "# HELP g_seconds A gauge\\\\with a backslash\n# TYPE g_seconds gauge\n"
            "g_seconds{host=\"a\\\"b\\nc\",rank=\"1\"} 0.25\n"
            "# HELP c_total A counter\n# TYPE c_total counter\nc_total 3\n");
  EXPECT_EQ(telemetry::ExpositionValue(0.1 + 0.2 + 0.4), "0.7000000000000001");
  EXPECT_EQ(telemetry::ExpositionValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(telemetry::ExpositionValue(std::nan("")), "NaN");
  EXPECT_EQ(telemetry::ExpositionValue(1e21), "1e+21");
}

}  // namespace
}  // namespace dlrun::rdzv
