// The port handed to a worker's store is held until the workers are gone: a store binding it
// with SO_REUSEADDR (as c10d's TCPStore does) succeeds, while a bind without it fails, so the
// kernel does not hand the port to another job's bind(port 0) in between.
#include "launcher/detect/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

int BindLocal(int port, bool reuse) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  if (rc == 0 && listen(fd, 1) == 0) return fd;
  close(fd);
  return -1;
}

TEST(PortReservation, TheStoreCanBindItAndNobodyElseCan) {
  PortReservation held = ReservePort("127.0.0.1");
  ASSERT_GT(held.port(), 0);
  EXPECT_EQ(BindLocal(held.port(), /*reuse=*/false), -1);  // held: a plain bind fails
  const int store = BindLocal(held.port(), /*reuse=*/true);  // the worker's TCPStore
  EXPECT_GE(store, 0);
  close(store);
  const int port = held.port();
  held = PortReservation();  // released with the attempt
  const int later = BindLocal(port, false);
  EXPECT_GE(later, 0);
  close(later);
}

// The one check of a HOST[:PORT] endpoint, both rendezvous backends' (--rdzv-endpoint).
TEST(HostPort, AnEndpointIsAHostAndAPortInRangeWhenOneIsGiven) {
  for (const char* good : {"node1", "node1:29400", "[::1]:0", "10.0.0.1:65535", "fe80::2"}) {
    EXPECT_TRUE(IsHostPort(good)) << good;
  }
  for (const char* bad : {"", ":29400", "node1:", "node1:abc", "node1:65536", "node1:-1"}) {
    EXPECT_FALSE(IsHostPort(bad)) << bad;
  }
}

}  // namespace
}  // namespace dlrun::launcher

namespace dlrun {
namespace {

// The one HOST[:PORT] splitter (common/host_port.h), IPv6 included, as every caller uses it.
TEST(HostPort, SplitsNamesV4AndBracketedV6AndLeavesABareV6Whole) {
  auto split = [](const char* s) {
    const HostPort hp = SplitHostPort(s);
    return hp.host + "|" + (hp.has_port ? hp.port : "-");
  };
  EXPECT_EQ(split("node1:29400"), "node1|29400");
  EXPECT_EQ(split("node1"), "node1|-");
  EXPECT_EQ(split("10.0.0.1:80"), "10.0.0.1|80");
  EXPECT_EQ(split("[::1]:29400"), "[::1]|29400");
  EXPECT_EQ(split("[fe80::2]"), "[fe80::2]|-");
  EXPECT_EQ(split("::1"), "::1|-");
  EXPECT_EQ(split("fe80::2"), "fe80::2|-");
  EXPECT_EQ(split("host:"), "host|");
  EXPECT_EQ(split(""), "|-");
  EXPECT_EQ(Unbracketed("[::1]"), "::1");
  EXPECT_EQ(Unbracketed("::1"), "::1");
  EXPECT_EQ(Unbracketed("[]"), "[]");
}

TEST(HostPort, JoinBracketsABareV6AndRoundTripsTheSplitter) {
  EXPECT_EQ(JoinHostPort("node1", 29400), "node1:29400");
  EXPECT_EQ(JoinHostPort("10.0.0.1", "80"), "10.0.0.1:80");
  EXPECT_EQ(JoinHostPort("::1", 29400), "[::1]:29400");
  EXPECT_EQ(JoinHostPort("[fe80::2]", 7), "[fe80::2]:7");  // bracketed once only
  for (const char* ep : {"node1:29400", "10.0.0.1:80", "[::1]:29400", "[fe80::2]:0"}) {
    const HostPort hp = SplitHostPort(ep);
    EXPECT_EQ(JoinHostPort(hp.host, hp.port), ep);
  }
}

}  // namespace
}  // namespace dlrun
