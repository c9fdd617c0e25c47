// In-process recovery across nodes, the job's side (rendezvous/regroup.h), over real gRPC on
// loopback: a node's ask reaches the other's held watch, global rank 0's node posts the port,
// a second ask and bad requests are refused, a new round ends the watches.
#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"
#include "tests/rdzv/test_client.h"

namespace dlrun::rdzv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class RegroupGrpc : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.handler.config.min_nodes = min_nodes_;
    o.handler.config.max_nodes = 2;
    o.handler.config.max_restarts = 3;
    o.handler.run_id = "run";
    o.handler.token = "tok";
    auto s = RendezvousServer::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    a_ = RendezvousClient::Create(Opts(server_->port()));
    b_ = RendezvousClient::Create(Opts(server_->port()));
    auto join = [](RendezvousClient* c, const std::string& id) {
      NodeInfo n;
      n.node_id = n.hostname = id;
      n.address = "127.0.0.1";
      n.nproc = 2;
      return c->Join(n, seconds(30));
    };
    auto ja = std::async(std::launch::async, join, a_.get(), "node-a");
    auto jb = join(b_.get(), "node-b");
    ASSERT_TRUE(jb.ok()) << jb.status();
    ASSERT_TRUE(ja.get().ok());
  }
  // A watch held on its own thread from what `known` says.
  std::future<absl::StatusOr<RegroupNotice>> WatchFrom(const RegroupNotice& known,
                                                       milliseconds timeout = seconds(20)) {
    return std::async(std::launch::async, [this, known, timeout] {
      return a_->WatchRegroup("node-a", known, timeout, [](std::function<void()>) {});
    });
  }
  using Watching = std::future<absl::StatusOr<RegroupNotice>>;
  // node-a and node-b each hold a watch from `known` on a thread of its own; returns once the
  // host holds both (or after 10 s), with what ends node-b's call (its agent going away).
  std::function<void()> HoldBothWatches(const RegroupNotice& known, Watching* a_watch,
                                        Watching* b_watch) {
    auto cancel = std::make_shared<std::promise<std::function<void()>>>();
    *b_watch = std::async(std::launch::async, [this, known, cancel] {
      bool first = true;
      return b_->WatchRegroup("node-b", known, seconds(20), [&](std::function<void()> c) {
        if (first) cancel->set_value(std::move(c));
        first = false;
      });
    });
    *a_watch = WatchFrom(known);
    std::function<void()> end_b = cancel->get_future().get();
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (server_->regroup().HeldWatches() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    return end_b;
  }
  static RegroupAsk Lost(int generation, std::vector<int> ranks, uint64_t round = 1) {
    return {round, generation, std::move(ranks), 0, "rank 3 (local rank 1, pid 9): SIGKILL"};
  }

  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> a_, b_;
  int min_nodes_ = 2;
};

// --nnodes 1:2: the job may go on with one node.
class RegroupGrpcElastic : public RegroupGrpc {
 protected:
  RegroupGrpcElastic() { min_nodes_ = 1; }
};

TEST_F(RegroupGrpc, AnAskReachesTheHeldWatchAndThePostedPortReachesItAgain) {
  RegroupNotice known;
  known.round = 1;
  auto held = WatchFrom(known);
  ASSERT_EQ(held.wait_for(milliseconds(200)), std::future_status::timeout);  // nothing yet
  auto asked = b_->AskRegroup("node-b", Lost(1, {3}));
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->master_port, 0);
  ASSERT_EQ(held.wait_for(seconds(10)), std::future_status::ready);
  auto seen = held.get();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->round, 1u);
  EXPECT_EQ(seen->generation, 1);
  EXPECT_EQ(seen->master_port, 0);
  EXPECT_EQ(seen->lost_ranks, std::vector<int>{3});
  EXPECT_EQ(seen->asked_by, "node-b");
  EXPECT_EQ(seen->reason, "rank 3 (local rank 1, pid 9): SIGKILL");

  auto again = WatchFrom(*seen);  // node-b's side now waits for the port
  ASSERT_EQ(again.wait_for(milliseconds(100)), std::future_status::timeout);
  auto posted = a_->AskRegroup("node-a", {1, 1, {}, 41000, ""});
  ASSERT_TRUE(posted.ok()) << posted.status();
  EXPECT_EQ(posted->master_port, 41000);
  ASSERT_EQ(again.wait_for(seconds(10)), std::future_status::ready);
  auto ported = again.get();
  ASSERT_TRUE(ported.ok()) << ported.status();
  EXPECT_EQ(ported->master_port, 41000);
  // The next loss asks for generation 2.
  EXPECT_TRUE(b_->AskRegroup("node-b", Lost(2, {2})).ok());
}

TEST_F(RegroupGrpc, ASecondAskForTheSameGenerationIsRefused) {
  ASSERT_TRUE(b_->AskRegroup("node-b", Lost(1, {3})).ok());
  auto second = a_->AskRegroup("node-a", Lost(1, {0}));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(second.status().message().find("is under way"), std::string_view::npos)
      << second.status();
  ASSERT_TRUE(a_->AskRegroup("node-a", {1, 1, {}, 41000, ""}).ok());
  auto skipped = a_->AskRegroup("node-a", Lost(3, {0}));
  EXPECT_EQ(skipped.status().code(), absl::StatusCode::kAborted);
  // The port once posted stays: another is refused.
  auto other_port = a_->AskRegroup("node-a", {1, 1, {}, 41001, ""});
  EXPECT_EQ(other_port.status().code(), absl::StatusCode::kAborted);
}

TEST_F(RegroupGrpc, BadRequestsAreRefusedWithTheFieldNamed) {
  auto zero = b_->AskRegroup("node-b", Lost(0, {3}));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("generation 0"), std::string_view::npos);
  auto empty = b_->AskRegroup("node-b", {1, 1, {}, 0, ""});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto port = b_->AskRegroup("node-b", {1, 1, {3}, 70000, ""});
  EXPECT_EQ(port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(port.status().message().find("master_port 70000"), std::string_view::npos);
  auto stale = b_->AskRegroup("node-b", Lost(1, {3}, /*round=*/7));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  RendezvousClient::CancelHook none = [](std::function<void()>) {};
  auto no_timeout = a_->WatchRegroup("node-a", {}, milliseconds(0), none);
  EXPECT_EQ(no_timeout.status().code(), absl::StatusCode::kInvalidArgument);
  auto wrong_token = RendezvousClient::Create(Opts(server_->port(), "guess"));
  EXPECT_EQ(wrong_token->AskRegroup("node-b", Lost(1, {3})).status().code(),
            absl::StatusCode::kPermissionDenied);
  // None of it changed the regroup: generation 1 is still free.
  EXPECT_TRUE(b_->AskRegroup("node-b", Lost(1, {3})).ok());
}

TEST_F(RegroupGrpc, AWatchEndsAtItsTimeoutAndWhenANewRoundOpens) {
  RegroupNotice known;
  known.round = 1;
  auto quiet = WatchFrom(known, milliseconds(50));
  ASSERT_EQ(quiet.wait_for(seconds(10)), std::future_status::ready);
  auto same = quiet.get();
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->generation, 0);
  auto held = WatchFrom(known);
  ASSERT_EQ(held.wait_for(milliseconds(100)), std::future_status::timeout);
  ASSERT_TRUE(b_->ReportFailure("node-b", 1, "worker 3 exited with 1", false, false).ok());
  ASSERT_EQ(held.wait_for(seconds(10)), std::future_status::ready);
  auto next = held.get();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->round, 2u);
  EXPECT_EQ(next->generation, 0);
}

TEST_F(RegroupGrpc, ACancelledWatchReturnsAtOnce) {
  std::promise<std::function<void()>> cancel;
  auto held = std::async(std::launch::async, [&] {
    bool first = true;
    RegroupNotice known;
    known.round = 1;
    return a_->WatchRegroup("node-a", known, seconds(20), [&](std::function<void()> c) {
      if (first) cancel.set_value(std::move(c));
      first = false;
    });
  });
  cancel.get_future().get()();
  ASSERT_EQ(held.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(held.get().status().code(), absl::StatusCode::kCancelled);
}

// A held watch does not keep the server from shutting down (the hosting agent's exit).
TEST_F(RegroupGrpc, AHeldWatchLetsTheServerShutDown) {
  RegroupNotice known;
  known.round = 1;
  auto held = WatchFrom(known);
  ASSERT_EQ(held.wait_for(milliseconds(100)), std::future_status::timeout);
  auto shutdown = std::async(std::launch::async, [this] { server_->Shutdown(); });
  ASSERT_EQ(shutdown.wait_for(seconds(10)), std::future_status::ready);
  ASSERT_EQ(held.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_FALSE(held.get().ok());
}

// A node's agent process ends (its held watch's connection closes): with every node recovering in
// process, the host leaves the node out of the running round within the watch grace, and the
// other node's watch hears its new place; the lost node, were it alive, is told to re-join.
TEST_F(RegroupGrpcElastic, ANodeWhoseWatchEndsIsLeftOutAndTheSurvivorHearsItsPlace) {
  ASSERT_TRUE(a_->Heartbeat("node-a", 1, /*in_process=*/true).ok());
  ASSERT_TRUE(b_->Heartbeat("node-b", 1, /*in_process=*/true).ok());
  RegroupNotice known;
  known.round = 1;
  Watching held, b_watch;
  std::function<void()> end_b = HoldBothWatches(known, &held, &b_watch);
  // Both watches held at the host before node-b's ends.
  ASSERT_EQ(server_->regroup().HeldWatches(), 2);
  const auto ended = std::chrono::steady_clock::now();
  end_b();
  ASSERT_EQ(held.wait_for(seconds(10)), std::future_status::ready);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - ended).count();
  auto seen = held.get();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->round, 1u);
  EXPECT_EQ(seen->generation, 1);
  EXPECT_EQ(seen->master_port, 0);  // posted by node-a, rank 0's node
  ASSERT_EQ(seen->places.size(), 1u);
  EXPECT_EQ(seen->places[0].node_id, "node-a");
  EXPECT_EQ(seen->places[0].rank_offset, 0);
  EXPECT_EQ(seen->world_size, 2);
  EXPECT_EQ(seen->master_addr, "127.0.0.1");
  EXPECT_NE(seen->reason.find("node-b, its connection closed"), std::string::npos) << seen->reason;
  EXPECT_LT(took, 5.0);  // well before the liveness limit (5 s), whatever the machine's load
  auto posted = a_->AskRegroup("node-a", {1, 1, {}, 41000, ""});
  ASSERT_TRUE(posted.ok()) << posted.status();
  EXPECT_EQ(posted->places.size(), 1u);  // the port joins the same regroup
  auto hb = b_->Heartbeat("node-b", 1, true);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->action, Action::kRestart);
  EXPECT_EQ(b_watch.get().status().code(), absl::StatusCode::kCancelled);
}

TEST_F(RegroupGrpcElastic, ANodeThatJoinsIsAdmittedAndItsJoinAnsweredWithThePostedPort) {
  ASSERT_TRUE(a_->Heartbeat("node-a", 1, /*in_process=*/true).ok());
  ASSERT_TRUE(b_->Heartbeat("node-b", 1, /*in_process=*/true).ok());
  // node-b's agent goes away (its held watch ends): the job goes on with node-a alone.
  RegroupNotice known;
  known.round = 1;
  Watching held, b_watch;
  std::function<void()> end_b = HoldBothWatches(known, &held, &b_watch);
  ASSERT_EQ(server_->regroup().HeldWatches(), 2);
  end_b();
  ASSERT_EQ(held.wait_for(seconds(10)), std::future_status::ready);
  auto lost = held.get();
  ASSERT_TRUE(lost.ok()) << lost.status();
  ASSERT_EQ(lost->places.size(), 1u);
  ASSERT_TRUE(a_->AskRegroup("node-a", {1, 1, {}, 41000, ""}).ok());
  b_watch.wait();

  // node-b comes back as a new agent: admitted into round 1, its join held for the port.
  auto c = RendezvousClient::Create(Opts(server_->port()));
  auto joined = std::async(std::launch::async, [&] {
    NodeInfo n;
    n.node_id = n.hostname = "node-b2";
    n.address = "127.0.0.2";
    n.nproc = 2;
    n.in_process = true;
    return c->Join(n, seconds(30));
  });
  RegroupNotice at_one = *lost;
  at_one.master_port = 41000;
  auto grown = WatchFrom(at_one);
  ASSERT_EQ(grown.wait_for(seconds(10)), std::future_status::ready);
  auto g = grown.get();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->round, 1u);
  EXPECT_EQ(g->generation, 2);
  EXPECT_EQ(g->master_port, 0);
  ASSERT_EQ(g->places.size(), 2u);
  EXPECT_EQ(g->places[1].node_id, "node-b2");
  EXPECT_EQ(g->places[1].rank_offset, 2);
  EXPECT_EQ(g->world_size, 4);
  EXPECT_NE(g->reason.find("joined the running round"), std::string::npos) << g->reason;
  EXPECT_EQ(joined.wait_for(milliseconds(100)), std::future_status::timeout);
  // node-a, rank 0's node, posts the port: the join returns with it and the generation.
  ASSERT_TRUE(a_->AskRegroup("node-a", {1, 2, {}, 42000, ""}).ok());
  ASSERT_EQ(joined.wait_for(seconds(10)), std::future_status::ready);
  auto j = joined.get();
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->assignment.round, 1u);
  EXPECT_EQ(j->assignment.node_rank, 1);
  EXPECT_EQ(j->assignment.rank_offset, 2);
  EXPECT_EQ(j->assignment.world_size, 4);
  EXPECT_EQ(j->assignment.master_addr, "127.0.0.1");
  EXPECT_EQ(j->assignment.master_port, 42000);
  EXPECT_EQ(j->assignment.recovery_generation, 2);
  auto hb = c->Heartbeat("node-b2", 1, true);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->action, Action::kContinue);
}

}  // namespace
}  // namespace dlrun::rdzv
