// The handler driven from many threads at once, without gRPC: eight nodes join, heartbeat,
// one reports a failure, all re-join and leave, while another thread runs the timers and reads
// the state. Under ThreadSanitizer (scripts/test-sanitizers tsan) this is the check on the
// handler's locking that no gRPC suppression can hide: every stack here is our code.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "rendezvous/handler.h"

namespace dlrun::rdzv {
namespace {

constexpr int kNodes = 8;

v1::Auth GoodAuth() {
  v1::Auth a;
  a.set_protocol_version(kProtocolVersion);
  a.set_run_id("job");
  a.set_token("tok-12345");
  return a;
}

// Joins and waits (at most 30 s) for the round to close.
absl::StatusOr<v1::Assignment> JoinAndWait(Handler& h, const std::string& id) {
  v1::JoinRequest r;
  *r.mutable_auth() = GoodAuth();
  r.mutable_node()->set_node_id(id);
  r.mutable_node()->set_hostname(id);
  r.mutable_node()->set_address("127.0.0.1");
  r.mutable_node()->set_nproc(2);
  r.mutable_node()->set_slurm_node_id(-1);
  r.mutable_node()->set_master_port(20000);
  auto done = std::make_shared<std::promise<absl::StatusOr<v1::Assignment>>>();
  auto result = done->get_future();
  h.Join(r, "thread", h.NewTicket(), [done](const absl::Status& s, const v1::JoinResponse& resp) {
    if (s.ok()) {
      done->set_value(resp.assignment());
    } else {
      done->set_value(s);
    }
  });
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return absl::DeadlineExceededError("join did not complete in 30 s");
  }
  return result.get();
}

v1::HeartbeatResponse::Action Beat(Handler& h, const std::string& id, uint64_t round) {
  v1::HeartbeatRequest r;
  *r.mutable_auth() = GoodAuth();
  r.set_node_id(id);
  r.set_round(round);
  v1::HeartbeatResponse resp;
  EXPECT_TRUE(h.Heartbeat(r, "thread", &resp).ok());
  return resp.action();
}

TEST(HandlerConcurrency, EightNodeThreadsThroughAFailureAndARestartWhileTimersRun) {
  HandlerOptions o;
  o.config.min_nodes = kNodes;
  o.config.max_nodes = kNodes;
  o.config.max_restarts = 1;
  o.config.heartbeat_interval = std::chrono::seconds(5);  // nobody is declared dead here
  o.run_id = "job";
  o.token = "tok-12345";
  Handler h(std::move(o));

  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  std::thread timers([&] {
    v1::StatusRequest sr;
    *sr.mutable_auth() = GoodAuth();
    while (!stop.load()) {
      (void)h.Tick();
      (void)h.phase();
      (void)h.round();
      (void)h.EndAcknowledged();
      v1::StatusResponse st;
      EXPECT_TRUE(h.Status(sr, "timers", &st).ok());
      reads.fetch_add(1);
      std::this_thread::yield();
    }
  });

  // The nodes start once the timers run (on a busy machine the nodes' whole run, a few ms, could
  // otherwise end before that thread was first scheduled).
  const auto started_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (reads.load() == 0 && std::chrono::steady_clock::now() < started_by) {
    std::this_thread::yield();
  }
  if (reads.load() == 0) {
    stop = true;
    timers.join();
    FAIL() << "the timers thread never ran";
  }
  std::vector<v1::Assignment> first(kNodes), second(kNodes);
  std::vector<std::thread> nodes;
  for (int i = 0; i < kNodes; ++i) {
    nodes.emplace_back([&, i] {
      const std::string id = "node-" + std::to_string(i);
      auto a = JoinAndWait(h, id);
      ASSERT_TRUE(a.ok()) << a.status();
      first[i] = *a;
      if (i == 3) {
        v1::FailureReport f;
        *f.mutable_auth() = GoodAuth();
        f.set_node_id(id);
        f.set_round(a->round());
        f.set_reason("worker 7 exited with 1");
        v1::FailureResponse fr;
        ASSERT_TRUE(h.ReportFailure(f, "thread", &fr).ok());
      } else {
        // Heartbeat until told to restart (bounded: the failure comes within milliseconds).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (Beat(h, id, a->round()) != v1::HeartbeatResponse::RESTART) {
          ASSERT_LT(std::chrono::steady_clock::now(), deadline) << id << " never told to restart";
          std::this_thread::yield();
        }
      }
      auto b = JoinAndWait(h, id);
      ASSERT_TRUE(b.ok()) << b.status();
      second[i] = *b;
      v1::LeaveRequest l;
      *l.mutable_auth() = GoodAuth();
      l.set_node_id(id);
      l.set_round(b->round());
      l.set_success(true);
      ASSERT_TRUE(h.Leave(l, "thread").ok());
    });
  }
  for (auto& t : nodes) t.join();
  stop = true;
  timers.join();

  for (int i = 0; i < kNodes; ++i) {
    EXPECT_EQ(first[i].round(), 1u);
    EXPECT_EQ(first[i].world_size(), 2u * kNodes);
    EXPECT_EQ(second[i].round(), 2u);
    EXPECT_EQ(second[i].restart_count(), 1u);
    EXPECT_EQ(second[i].node_rank(), first[i].node_rank());
  }
  EXPECT_EQ(h.phase(), StateMachine::Phase::kSucceeded);
  EXPECT_GT(reads.load(), 0);
}

}  // namespace
}  // namespace dlrun::rdzv
