// Real gRPC over loopback (port 0): 64 agents through two rounds, and hostile clients.
#include <grpcpp/grpcpp.h>

#include <set>
#include <thread>

#include "dlrun/proto/rendezvous.grpc.pb.h"
#include "gtest/gtest.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"
#include "tests/rdzv/test_client.h"

namespace dlrun::rdzv {
namespace {

std::unique_ptr<RendezvousServer> StartServer(int nodes, int max_restarts) {
  ServerOptions o;
  o.handler.config.min_nodes = nodes;
  o.handler.config.max_nodes = nodes;
  o.handler.config.max_restarts = max_restarts;
  o.handler.run_id = "run";
  o.handler.token = "tok";
  auto s = RendezvousServer::Start(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

TEST(RendezvousGrpc, SixtyFourAgentsThroughTwoRounds) {
  constexpr int kAgents = 64;
  auto server = StartServer(kAgents, 1);
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < kAgents; ++i) clients.push_back(RendezvousClient::Create(Opts(server->port())));

  auto join_all = [&](std::vector<Assignment>* out) {
    out->assign(kAgents, Assignment{});
    std::vector<std::thread> threads;
    std::vector<absl::Status> errs(kAgents);
    for (int i = 0; i < kAgents; ++i) {
      threads.emplace_back([&, i] {
        NodeInfo n;
        n.node_id = "node-" + std::to_string(1000 + i);
        n.hostname = n.node_id;
        n.address = "127.0.0.1";
        n.nproc = 1 + i % 3;
        n.master_port = 20000 + i;
        auto a = clients[i]->Join(n, std::chrono::seconds(30));
        if (a.ok()) (*out)[i] = a->assignment; else errs[i] = a.status();
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errs) ASSERT_TRUE(e.ok()) << e;
  };
  auto check = [&](const std::vector<Assignment>& as, uint64_t round, int restarts) {
    std::set<int> node_ranks, offsets;
    int world = 0;
    for (int i = 0; i < kAgents; ++i) world += 1 + i % 3;
    for (const auto& a : as) {
      EXPECT_EQ(a.round, round);
      EXPECT_EQ(a.restart_count, restarts);
      EXPECT_EQ(a.world_size, world);
      EXPECT_EQ(a.num_nodes, kAgents);
      EXPECT_EQ(a.master_port, 20000);  // node-1000 sorts first
      node_ranks.insert(a.node_rank);
      offsets.insert(a.rank_offset);
    }
    EXPECT_EQ(node_ranks.size(), static_cast<size_t>(kAgents));
    EXPECT_EQ(offsets.size(), static_cast<size_t>(kAgents));
  };

  std::vector<Assignment> r1, r2;
  join_all(&r1);
  check(r1, 1, 0);
  auto hb = clients[5]->Heartbeat("node-1005", 1);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->action, Action::kContinue);

  auto f = clients[7]->ReportFailure("node-1007", 1, "worker 3 exited with 1", false, false);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->next_round, 2u);
  hb = clients[5]->Heartbeat("node-1005", 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->action, Action::kRestart);

  join_all(&r2);
  check(r2, 2, 1);
  for (int i = 0; i < kAgents; ++i) {
    EXPECT_EQ(r1[i].node_rank, r2[i].node_rank);  // same nodes, same ranks
  }
  for (int i = 0; i < kAgents; ++i) {
    ASSERT_TRUE(clients[i]->Leave("node-" + std::to_string(1000 + i), 2, true).ok());
  }
  EXPECT_EQ(server->handler().phase(), StateMachine::Phase::kSucceeded);
  // Every node hears the end at its next heartbeat, which lets a hosting agent stop serving.
  EXPECT_FALSE(server->handler().EndAcknowledged());
  for (int i = 0; i < kAgents; ++i) {
    auto end = clients[i]->Heartbeat("node-" + std::to_string(1000 + i), 2);
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->action, Action::kFinished);
  }
  EXPECT_TRUE(server->WaitForJobEnd(std::chrono::seconds(5)));
  EXPECT_TRUE(server->handler().EndAcknowledged());
}

TEST(RendezvousGrpc, WrongTokenIsRefusedOverTheWire) {
  auto server = StartServer(2, 0);
  auto bad = RendezvousClient::Create(Opts(server->port(), "wrong"));
  NodeInfo n{"x", "x", "127.0.0.1", 1, -1, 0};
  auto a = bad->Join(n, std::chrono::seconds(5));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kPermissionDenied);
  auto good = RendezvousClient::Create(Opts(server->port()));
  auto st = good->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->joined, 0);
}

TEST(RendezvousGrpc, OversizedMessageIsRejected) {
  auto server = StartServer(2, 0);
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Rendezvous::NewStub(channel);
  v1::FailureReport req;
  req.mutable_auth()->set_protocol_version(1);
  req.mutable_auth()->set_run_id("run");
  req.mutable_auth()->set_token("tok");
  req.set_node_id("x");
  req.set_reason(std::string(200 * 1024, 'A'));
  grpc::ClientContext ctx;
  v1::FailureResponse resp;
  grpc::Status s = stub->ReportFailure(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(server->handler().round(), 1u);
}

TEST(RendezvousGrpc, CancelledJoinLeavesTheRound) {
  auto server = StartServer(2, 0);
  auto c = RendezvousClient::Create(Opts(server->port()));
  NodeInfo n{"a", "a", "127.0.0.1", 1, -1, 0};
  // A join whose deadline passes is cancelled on the server and forgotten.
  auto a = c->Join(n, std::chrono::milliseconds(200));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded);
  // Wait (with a deadline) for the server to see the cancellation.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int joined = -1;
  std::string last_error;
  while (std::chrono::steady_clock::now() < end) {
    auto st = c->Status();  // fails fast while the channel reconnects (slow under TSan): retry
    if (st.ok()) {
      joined = st->joined;
      if (joined == 0) break;
    } else {
      last_error = std::string(st.status().message());
    }
    std::this_thread::yield();
  }
  EXPECT_EQ(joined, 0) << last_error;
}

}  // namespace
}  // namespace dlrun::rdzv
