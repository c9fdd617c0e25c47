// RdzvRegroup (launcher/rdzv/rdzv_regroup.h): the agent's side of the job's regroups over a
// scripted client: a watch's news wakes the agent, an ask's answer that comes late never takes
// back a port a watch brought, and a new round starts the watch afresh.
#include "launcher/rdzv/rdzv_regroup.h"

#include <condition_variable>
#include <deque>
#include <mutex>

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

using std::chrono::seconds;

// What the scripted host answers: watches take `answers` in turn and are held (until cancelled
// or a new answer) when there is none; every ask gets `ask_answer`.
struct Host {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<rdzv::RegroupNotice> answers;
  rdzv::RegroupNotice ask_answer;
  std::vector<rdzv::RegroupNotice> watched_from;
  bool cancelled = false;
};

class ScriptedClient final : public rdzv::RendezvousClient {
 public:
  explicit ScriptedClient(Host& h) : h_(h) {}
  absl::StatusOr<rdzv::JoinResult> Join(const rdzv::NodeInfo&, rdzv::Duration) override {
    return absl::UnimplementedError("join");
  }
  absl::StatusOr<rdzv::HeartbeatReply> Heartbeat(const std::string&, uint64_t, bool) override {
    return absl::UnimplementedError("heartbeat");
  }
  absl::StatusOr<rdzv::FailureReply> ReportFailure(const std::string&, uint64_t,
                                                   const std::string&, bool, bool) override {
    return absl::UnimplementedError("report");
  }
  absl::Status Leave(const std::string&, uint64_t, bool) override { return absl::OkStatus(); }
  absl::StatusOr<rdzv::StatusSnapshot> Status(rdzv::Duration) override {
    return absl::UnimplementedError("status");
  }
  void set_epoch(uint64_t) override {}
  const std::string& endpoint() const override { return endpoint_; }

  absl::StatusOr<rdzv::RegroupNotice> AskRegroup(const std::string&,
                                                 const rdzv::RegroupAsk&) override {
    std::lock_guard<std::mutex> l(h_.mu);
    return h_.ask_answer;
  }
  absl::StatusOr<rdzv::RegroupNotice> WatchRegroup(const std::string&,
                                                   const rdzv::RegroupNotice& known,
                                                   rdzv::Duration,
                                                   const CancelHook& on_call) override {
    {
      std::lock_guard<std::mutex> l(h_.mu);
      h_.watched_from.push_back(known);
      h_.cancelled = false;
    }
    h_.cv.notify_all();
    on_call([this] {
      std::lock_guard<std::mutex> l(h_.mu);
      h_.cancelled = true;
      h_.cv.notify_all();
    });
    std::unique_lock<std::mutex> l(h_.mu);
    h_.cv.wait(l, [this] { return h_.cancelled || !h_.answers.empty(); });
    absl::StatusOr<rdzv::RegroupNotice> r = absl::CancelledError("cancelled");
    if (!h_.cancelled) {
      r = h_.answers.front();
      h_.answers.pop_front();
    }
    l.unlock();
    on_call({});
    return r;
  }

 private:
  Host& h_;
  std::string endpoint_ = "host:1";
};

rdzv::RegroupNotice Notice(uint64_t round, int generation, int port) {
  rdzv::RegroupNotice n;
  n.round = round;
  n.generation = generation;
  n.master_port = port;
  n.lost_ranks = {3};
  n.asked_by = "node-b";
  return n;
}

TEST(RdzvRegroup, ALateAskAnswerNeverTakesBackThePortAWatchBrought) {
  Host host;
  host.answers.push_back(Notice(1, 1, 41000));  // the port, posted before the ask's answer
  host.ask_answer = Notice(1, 1, 0);
  RdzvRegroup regroup([&](const std::string&) { return std::make_unique<ScriptedClient>(host); },
                      "node-b");
  std::mutex mu;
  std::condition_variable cv;
  int wakes = 0;
  regroup.Watch([&] {
    std::lock_guard<std::mutex> l(mu);
    ++wakes;
    cv.notify_all();
  });
  regroup.Begin("host:1", 1, 1);
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, seconds(10), [&] { return wakes > 0; }));
  }
  EXPECT_EQ(regroup.Latest().master_port, 41000);
  auto asked = regroup.Ask(1, {3}, 0, "rank 3: SIGKILL");
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->master_port, 0);  // the answer as the host gave it
  EXPECT_EQ(regroup.Latest().master_port, 41000);
  EXPECT_EQ(regroup.Latest().lost_ranks, std::vector<int>{3});
  // The next watch went on from what the first brought.
  std::unique_lock<std::mutex> l(host.mu);
  ASSERT_TRUE(host.cv.wait_for(l, seconds(10), [&] { return host.watched_from.size() >= 2; }));
  EXPECT_EQ(host.watched_from[1].master_port, 41000);
}

TEST(RdzvRegroup, ANewRoundStartsTheWatchAfresh) {
  Host host;
  host.answers.push_back(Notice(1, 1, 41000));
  RdzvRegroup regroup([&](const std::string&) { return std::make_unique<ScriptedClient>(host); },
                      "node-b");
  regroup.Watch([] {});
  regroup.Begin("host:1", 1, 1);
  {
    std::unique_lock<std::mutex> l(host.mu);
    ASSERT_TRUE(host.cv.wait_for(l, seconds(10), [&] { return host.watched_from.size() >= 2; }));
  }
  EXPECT_EQ(regroup.Latest().generation, 1);
  regroup.Begin("host:1", 2, 1);  // cancels the held watch, starts one for round 2
  EXPECT_EQ(regroup.Latest().generation, 0);
  std::unique_lock<std::mutex> l(host.mu);
  ASSERT_TRUE(host.cv.wait_for(l, seconds(10), [&] {
    return !host.watched_from.empty() && host.watched_from.back().round == 2;
  }));
  EXPECT_EQ(host.watched_from.back().generation, 0);
}

}  // namespace
}  // namespace dlrun::launcher
