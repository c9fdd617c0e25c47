// The host side of rendezvous failover (docs/FAILOVER.md), one test per case of the protocol,
// on a fake clock: a new host rebuilds the job from the survivors' resumes, successors travel
// with each assignment, epochs fence stale hosts, a host that stepped down redirects everyone,
// and candidate lists must agree.
#include <map>

#include "gtest/gtest.h"
#include "rendezvous/handler.h"
#include "rendezvous/state_machine.h"

namespace dlrun::rdzv {
namespace {

using std::chrono::seconds;

NodeInfo Node(const std::string& id, int slurm = -1) {
  NodeInfo n;
  n.node_id = id;
  n.hostname = "host-" + id;
  n.address = "addr-" + id;
  n.nproc = 2;
  n.slurm_node_id = slurm;
  return n;
}

// A new host's state machine, joined by survivors of a lost host's round.
class NewHost : public ::testing::Test {
 protected:
  void Make(Config c) { sm_ = std::make_unique<StateMachine>(c, now_); }
  absl::Status Join(NodeInfo n) {
    Deliveries out;
    const std::string id = n.node_id;
    absl::Status s = sm_->Join(n, ++ticket_, now_,
                               [this, id](absl::StatusOr<Assignment> a) { results_[id] = a; }, &out);
    for (auto& d : out) d.callback(std::move(d.result));
    return s;
  }
  static NodeInfo Survivor(const std::string& id, uint64_t round, int restarts, int survivors) {
    NodeInfo n = Node(id);
    n.resume = {round, restarts, survivors, "old-host:29400"};
    return n;
  }
  void Advance(std::chrono::milliseconds d) {
    now_ += d;
    Deliveries out;
    sm_->Tick(now_, &out);
    for (auto& x : out) x.callback(std::move(x.result));
  }

  TimePoint now_ = TimePoint() + std::chrono::hours(1);
  std::unique_ptr<StateMachine> sm_;
  std::map<std::string, absl::StatusOr<Assignment>> results_;
  uint64_t ticket_ = 0;
};

// Case 1: the host is lost; the survivors' resumes give the new host the next round and the
// restart count plus one, and the round closes as soon as every survivor is back (no last call).
TEST_F(NewHost, RebuildsRoundAndRestartCountAndClosesWhenEverySurvivorIsBack) {
  Make({.min_nodes = 1, .max_nodes = 3, .last_call = seconds(30), .max_restarts = 5});
  ASSERT_TRUE(Join(Survivor("b", 7, 2, 2)).ok());
  EXPECT_TRUE(results_.empty());  // waits for the other survivor, not for the last call
  ASSERT_TRUE(Join(Survivor("c", 7, 2, 2)).ok());
  ASSERT_EQ(results_.size(), 2u);
  for (auto& [id, r] : results_) {
    ASSERT_TRUE(r.ok()) << id << ": " << r.status();
    EXPECT_EQ(r->round, 8u);
    EXPECT_EQ(r->restart_count, 3);
    EXPECT_EQ(r->num_nodes, 2);
  }
}

// Case 2: a survivor that never comes (it died with the host) costs the last call, no more.
TEST_F(NewHost, ASurvivorThatNeverComesCostsTheLastCall) {
  Make({.min_nodes = 1, .max_nodes = 3, .last_call = seconds(2), .max_restarts = 5});
  ASSERT_TRUE(Join(Survivor("b", 3, 0, 2)).ok());
  Advance(seconds(1));
  EXPECT_TRUE(results_.empty());
  Advance(seconds(1));
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_["b"]->round, 4u);
  EXPECT_EQ(results_["b"]->num_nodes, 1);
}

// Case 3: the host's loss counts as a restart; with none left the job fails, naming the cause.
TEST_F(NewHost, NoRestartsLeftEndsTheJobWithRendezvousHostLost) {
  Make({.min_nodes = 1, .max_nodes = 2, .max_restarts = 1});
  absl::Status s = Join(Survivor("b", 2, 1, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.message()).find("the rendezvous host (old-host:29400) was lost; no "
                                          "restarts left (max_restarts=1)"),
            std::string::npos)
      << s;
  EXPECT_EQ(sm_->state().phase, StateMachine::Phase::kFailed);
}

// Case 4: a resume reaching a host that already runs a round (a late survivor) is an
// ordinary re-join: it opens a scale-up round and does not count a restart again.
TEST_F(NewHost, ALateSurvivorAtARunningHostIsAnOrdinaryJoin) {
  Make({.min_nodes = 1, .max_nodes = 3, .last_call = seconds(1), .max_restarts = 5});
  ASSERT_TRUE(Join(Survivor("b", 3, 0, 1)).ok());
  ASSERT_TRUE(results_["b"].ok());
  EXPECT_EQ(sm_->state().restart_count, 1);
  ASSERT_TRUE(Join(Survivor("c", 3, 0, 2)).ok());  // opens a scale-up round
  ASSERT_TRUE(Join(Survivor("b", 4, 1, 1)).ok());  // b re-joins it
  ASSERT_TRUE(results_["c"].ok()) << results_["c"].status();
  EXPECT_EQ(results_["c"]->round, 5u);
  EXPECT_EQ(results_["c"]->restart_count, 1);
  EXPECT_EQ(results_["c"]->num_nodes, 2);
}

// Case 5: the successors are the members in node-rank order (Slurm node id order when known),
// the host left out, at most kMaxSuccessors.
TEST_F(NewHost, SuccessorsAreMembersInNodeRankOrderWithoutTheHost) {
  Make({.min_nodes = 10, .max_nodes = 10});
  for (int i = 9; i >= 0; --i) ASSERT_TRUE(Join(Node("n" + std::to_string(i), i)).ok());
  ASSERT_EQ(results_.size(), 10u);
  std::vector<Successor> s = sm_->members().Successors("n0");
  ASSERT_EQ(s.size(), kMaxSuccessors);
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].node_id, "n" + std::to_string(i + 1));
    EXPECT_EQ(s[i].address, "addr-n" + std::to_string(i + 1));
  }
  EXPECT_EQ(sm_->members().Successors("").front().node_id,
            "n0");  // stand-alone: the host is no member
}

// The handler: epochs, redirects and candidate lists.
class EpochTest : public ::testing::Test {
 protected:
  void Make(uint64_t epoch, const std::string& candidates = "") {
    HandlerOptions o;
    o.config.min_nodes = 1;
    o.config.max_nodes = 2;
    o.config.last_call = seconds(1);
    o.run_id = "job1";
    o.token = "s3cret-token";
    o.epoch = epoch;
    o.host_node_id = "host";
    o.candidates = candidates;
    o.now = [this] { return now_; };
    h_ = std::make_unique<Handler>(std::move(o));
  }
  v1::Auth Auth(uint64_t epoch) {
    v1::Auth a;
    a.set_protocol_version(kProtocolVersion);
    a.set_run_id("job1");
    a.set_token("s3cret-token");
    a.set_epoch(epoch);
    return a;
  }
  v1::JoinRequest JoinReq(const std::string& id, uint64_t epoch) {
    v1::JoinRequest r;
    *r.mutable_auth() = Auth(epoch);
    r.mutable_node()->set_node_id(id);
    r.mutable_node()->set_hostname("h" + id);
    r.mutable_node()->set_address("10.0.0." + id);
    r.mutable_node()->set_nproc(1);
    r.mutable_node()->set_slurm_node_id(-1);
    return r;
  }
  // Joins and ticks past the last call; returns the status and the response.
  std::pair<absl::Status, v1::JoinResponse> Join(const v1::JoinRequest& r) {
    std::pair<absl::Status, v1::JoinResponse> got{absl::UnknownError("pending"), {}};
    h_->Join(r, "test", h_->NewTicket(), [&](const absl::Status& s, const v1::JoinResponse& j) {
      got = {s, j};
    });
    now_ += seconds(2);
    h_->Tick();
    return got;
  }

  TimePoint now_ = TimePoint() + std::chrono::hours(1);
  std::unique_ptr<Handler> h_;
};

// Case 6: every reply carries the host's epoch; a join's reply also the successors.
TEST_F(EpochTest, RepliesCarryTheEpochAndSuccessors) {
  Make(3);
  v1::JoinRequest a = JoinReq("1", 0), b = JoinReq("2", 0);
  std::pair<absl::Status, v1::JoinResponse> ra{absl::UnknownError("pending"), {}};
  h_->Join(a, "t", h_->NewTicket(), [&](const absl::Status& s, const v1::JoinResponse& j) {
    ra = {s, j};
  });
  auto rb = Join(b);
  ASSERT_TRUE(ra.first.ok()) << ra.first;
  ASSERT_TRUE(rb.first.ok()) << rb.first;
  EXPECT_EQ(ra.second.epoch(), 3u);
  ASSERT_EQ(ra.second.successors_size(), 2);  // the host ("host") is not a member here
  EXPECT_EQ(ra.second.successors(0).node_id(), "1");
  EXPECT_EQ(ra.second.successors(1).address(), "10.0.0.2");
  v1::HeartbeatRequest hb;
  *hb.mutable_auth() = Auth(3);
  hb.set_node_id("1");
  hb.set_round(ra.second.assignment().round());
  v1::HeartbeatResponse hr;
  ASSERT_TRUE(h_->Heartbeat(hb, "t", &hr).ok());
  EXPECT_EQ(hr.epoch(), 3u);
  EXPECT_EQ(hr.action(), v1::HeartbeatResponse::CONTINUE);
}

// Case 7: a caller that has seen a newer epoch is refused by a stale host, which changes nothing.
TEST_F(EpochTest, AStaleHostRefusesCallersThatSawANewerEpoch) {
  Make(1);
  auto r = Join(JoinReq("1", 2));
  EXPECT_EQ(r.first.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(r.first.message())
                .find("stale rendezvous host: it serves epoch 1 but the caller has seen epoch 2"),
            std::string::npos)
      << r.first;
  v1::StatusRequest sr;
  *sr.mutable_auth() = Auth(1);
  v1::StatusResponse st;
  ASSERT_TRUE(h_->Status(sr, "t", &st).ok());
  EXPECT_EQ(st.joined(), 0u);
  EXPECT_EQ(st.epoch(), 1u);
}

// Case 8: a host that learns of a newer epoch steps down: joins and heartbeats (its own agent's
// too) are redirected to the newer host, so the former host's side re-joins there.
TEST_F(EpochTest, AHostThatSteppedDownRedirectsJoinsAndHeartbeats) {
  Make(1);
  auto first = Join(JoinReq("1", 0));
  ASSERT_TRUE(first.first.ok());
  EXPECT_FALSE(h_->StepDown("10.0.0.9:29400", 1)) << "an equal epoch is no reason";
  EXPECT_TRUE(h_->StepDown("10.0.0.9:29400", 2));
  EXPECT_FALSE(h_->StepDown("10.0.0.8:29400", 3)) << "steps down once";
  v1::HeartbeatRequest hb;
  *hb.mutable_auth() = Auth(1);
  hb.set_node_id("1");
  hb.set_round(first.second.assignment().round());
  v1::HeartbeatResponse hr;
  ASSERT_TRUE(h_->Heartbeat(hb, "t", &hr).ok());
  EXPECT_EQ(hr.action(), v1::HeartbeatResponse::RESTART);
  EXPECT_EQ(hr.redirect(), "10.0.0.9:29400");
  auto again = Join(JoinReq("1", 1));
  ASSERT_TRUE(again.first.ok());
  EXPECT_EQ(again.second.redirect(), "10.0.0.9:29400");
  EXPECT_FALSE(again.second.has_assignment());
  v1::StatusRequest sr;
  *sr.mutable_auth() = Auth(0);
  v1::StatusResponse st;
  ASSERT_TRUE(h_->Status(sr, "t", &st).ok());
  EXPECT_EQ(st.redirect(), "10.0.0.9:29400");
}

// Case 9: candidate lists that disagree between agents: a one-line error naming both.
TEST_F(EpochTest, ACandidateListThatDisagreesIsRefusedNamingBoth) {
  Make(1, "a:1,b:1");
  auto req = JoinReq("1", 0);
  req.set_candidates("a:1,c:1");
  auto r = Join(req);
  EXPECT_EQ(r.first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.first.message())
                .find("the rendezvous candidate lists disagree: this host has 'a:1,b:1', node h1 "
                      "has 'a:1,c:1'"),
            std::string::npos)
      << r.first;
}

// Case 10: a host whose own agent went silent too was not running (a frozen process): when
// it runs again the others get a fresh liveness limit instead of being declared dead at once;
// a node that stays silent is declared dead after that limit.
TEST_F(EpochTest, AFrozenHostGivesEveryoneAFreshLimitInsteadOfDeclaringThemDead) {
  Make(1);
  std::pair<absl::Status, v1::JoinResponse> rh{absl::UnknownError("pending"), {}};
  h_->Join(JoinReq("host", 0), "t", h_->NewTicket(),
           [&](const absl::Status& s, const v1::JoinResponse& j) { rh = {s, j}; });
  auto rb = Join(JoinReq("b", 0));
  ASSERT_TRUE(rh.first.ok() && rb.first.ok());
  const uint64_t round = rb.second.assignment().round();
  now_ += seconds(30);  // nobody was heard: the hosting process was stopped
  h_->Tick();
  v1::StatusRequest sr;
  *sr.mutable_auth() = Auth(1);
  v1::StatusResponse st;
  ASSERT_TRUE(h_->Status(sr, "t", &st).ok());
  EXPECT_EQ(st.state(), "running");
  EXPECT_EQ(st.round(), round);
  // Now only the host's own agent heartbeats: b is declared dead one limit (5 s) later.
  v1::HeartbeatRequest hb;
  *hb.mutable_auth() = Auth(1);
  hb.set_node_id("host");
  hb.set_round(round);
  for (int i = 0; i < 6; ++i) {
    now_ += seconds(1);
    v1::HeartbeatResponse hr;
    ASSERT_TRUE(h_->Heartbeat(hb, "t", &hr).ok());
    h_->Tick();
  }
  ASSERT_TRUE(h_->Status(sr, "t", &st).ok());
  EXPECT_GT(st.round(), round) << "b was not declared dead";
}

// A resume with absurd figures is refused before it reaches the state.
TEST_F(EpochTest, AResumeOutOfRangeIsRefusedNamingTheFields) {
  Make(2);
  auto req = JoinReq("1", 1);
  req.mutable_resume()->set_round(4);
  req.mutable_resume()->set_survivors(5000000);
  auto r = Join(req);
  EXPECT_EQ(r.first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.first.message()).find("resume.survivors 5000000"), std::string::npos);
}

}  // namespace
}  // namespace dlrun::rdzv
