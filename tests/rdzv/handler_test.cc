// The proto layer: every request is checked before it reaches the state machine.
#include "rendezvous/handler.h"
#include "rendezvous/job_channel.h"

#include "gtest/gtest.h"

namespace dlrun::rdzv {
namespace {

class HandlerTest : public ::testing::Test {
 protected:
  HandlerTest() {
    HandlerOptions o;
    o.config.min_nodes = 2;
    o.config.max_nodes = 2;
    o.run_id = "job1";
    o.token = "s3cret-token";
    o.now = [this] { return now_; };
    o.on_refused = [this](const absl::Status& s, const std::string&) { refused_.push_back(s); };
    h_ = std::make_unique<Handler>(std::move(o));
  }
  v1::JoinRequest GoodJoin(const std::string& id) {
    v1::JoinRequest r;
    r.mutable_auth()->set_protocol_version(kProtocolVersion);
    r.mutable_auth()->set_run_id("job1");
    r.mutable_auth()->set_token("s3cret-token");
    r.mutable_node()->set_node_id(id);
    r.mutable_node()->set_hostname("h" + id);
    r.mutable_node()->set_address("127.0.0.1");
    r.mutable_node()->set_nproc(2);
    r.mutable_node()->set_slurm_node_id(-1);
    return r;
  }
  absl::Status JoinNow(const v1::JoinRequest& r) {
    absl::Status got = absl::UnknownError("pending");
    h_->Join(r, "test", h_->NewTicket(),
             [&](const absl::Status& s, const v1::JoinResponse&) { got = s; });
    return got;
  }
  void ExpectStateUnchanged() {
    v1::StatusRequest sr;
    *sr.mutable_auth() = GoodJoin("x").auth();
    v1::StatusResponse st;
    ASSERT_TRUE(h_->Status(sr, "test", &st).ok());
    EXPECT_EQ(st.round(), 1u);
    EXPECT_EQ(st.state(), "joining");
    EXPECT_EQ(st.joined(), 0u);
  }

  TimePoint now_ = TimePoint() + std::chrono::hours(1);
  std::unique_ptr<Handler> h_;
  std::vector<absl::Status> refused_;
};

TEST_F(HandlerTest, WrongTokenOrRunIdIsPermissionDeniedAndChangesNothing) {
  auto r = GoodJoin("a");
  r.mutable_auth()->set_token("guess");
  EXPECT_EQ(JoinNow(r).code(), absl::StatusCode::kPermissionDenied);
  r = GoodJoin("a");
  r.mutable_auth()->set_run_id("other-job");
  EXPECT_EQ(JoinNow(r).code(), absl::StatusCode::kPermissionDenied);
  r = GoodJoin("a");
  r.mutable_auth()->clear_token();
  EXPECT_EQ(JoinNow(r).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused_.size(), 3u);  // each refusal is reported for the log
  ExpectStateUnchanged();
  v1::HeartbeatRequest hb;
  hb.mutable_auth()->set_protocol_version(kProtocolVersion);
  hb.mutable_auth()->set_run_id("job1");
  hb.mutable_auth()->set_token("nope");
  hb.set_node_id("a");
  v1::HeartbeatResponse hr;
  EXPECT_EQ(h_->Heartbeat(hb, "p", &hr).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(HandlerTest, OldProtocolVersionGetsAClearError) {
  auto r = GoodJoin("a");
  r.mutable_auth()->set_protocol_version(0);
  absl::Status s = JoinNow(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.message()).find("protocol version 0 is not supported"),
            std::string::npos);
  ExpectStateUnchanged();
  // Protocol 2 sent telemetry on heartbeats, before the job channel had a service of its own:
  // an agent of that release is told in one line, on either service.
  r = GoodJoin("a");
  r.mutable_auth()->set_protocol_version(2);
  EXPECT_EQ(std::string(JoinNow(r).message()),
            "rendezvous protocol version 2 is not supported: this server speaks version 3 "
            "(update dlrun on every node to the same release)");
  ChannelHandler ch(*h_);
  v1::PublishRequest pub;
  *pub.mutable_auth() = r.auth();
  pub.set_node_id("a");
  v1::PublishResponse resp;
  EXPECT_EQ(ch.Publish(pub, "p", &resp).code(), absl::StatusCode::kFailedPrecondition);
  ExpectStateUnchanged();
}

TEST_F(HandlerTest, MalformedNodeIdentityIsRejectedNamingTheField) {
  struct Case {
    std::function<void(v1::NodeIdentity*)> mutate;
    std::string expect;
  };
  std::vector<Case> cases = {
      {[](auto* n) { n->set_node_id(""); }, "node.node_id is empty"},
      {[](auto* n) { n->set_node_id(std::string(300, 'x')); }, "node.node_id is 300 bytes"},
      {[](auto* n) { n->set_hostname("evil\nhost"); }, "node.hostname contains a control"},
      {[](auto* n) { n->set_address(""); }, "node.address is empty"},
      {[](auto* n) { n->set_nproc(0); }, "node.nproc is 0 (expected 1-4096)"},
      {[](auto* n) { n->set_nproc(100000); }, "node.nproc is 100000"},
      {[](auto* n) { n->set_master_port(70000); }, "node.master_port is 70000"},
      {[](auto* n) { n->set_slurm_node_id(-5); }, "node.slurm_node_id is -5"},
  };
  for (auto& c : cases) {
    auto r = GoodJoin("a");
    c.mutate(r.mutable_node());
    absl::Status s = JoinNow(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expect;
    EXPECT_NE(std::string(s.message()).find(c.expect), std::string::npos) << s.message();
  }
  ExpectStateUnchanged();
}

TEST_F(HandlerTest, GarbageBytesDoNotParseIntoAJoin) {
  // What a client sending garbage gets through: protobuf either rejects the bytes or yields a
  // message whose fields fail validation. Either way nothing joins.
  // The inputs cover both outcomes (the counts below), so neither branch goes unchecked.
  const std::string garbage[] = {std::string("\xff\xff\xff\xff\x0f", 5), "hello world",
                                 std::string(1000, '\x0a'), std::string("\x08\x96\x01", 3)};
  int rejected_by_protobuf = 0, rejected_by_validation = 0;
  for (const std::string& g : garbage) {
    v1::JoinRequest r;
    if (!r.ParseFromString(g)) {
      ++rejected_by_protobuf;
      continue;
    }
    EXPECT_FALSE(JoinNow(r).ok()) << r.ShortDebugString();
    ++rejected_by_validation;
  }
  EXPECT_GT(rejected_by_protobuf, 0);
  EXPECT_GT(rejected_by_validation, 0);
  ExpectStateUnchanged();
}

TEST_F(HandlerTest, GoodJoinsComplete) {
  absl::Status a = absl::UnknownError("pending"), b = a;
  v1::JoinResponse ra, rb;
  h_->Join(GoodJoin("a"), "p", h_->NewTicket(), [&](const absl::Status& s, const auto& r) {
    a = s;
    ra = r;
  });
  EXPECT_EQ(a.code(), absl::StatusCode::kUnknown);  // still pending
  h_->Join(GoodJoin("b"), "p", h_->NewTicket(), [&](const absl::Status& s, const auto& r) {
    b = s;
    rb = r;
  });
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(ra.assignment().world_size(), 4u);
  EXPECT_NE(ra.assignment().node_rank(), rb.assignment().node_rank());
}

// A job-wide `dlrun stacks` on the job channel: every member is asked in the answer to its next
// Publish; the call ends when each has posted, or at the timeout with the silent ones under
// `missing`. A wrong token gets nothing, and a post for a collection that is over changes
// nothing.
TEST_F(HandlerTest, StacksAreAskedOnPublishesAndEndWhenAllPostedOrAtTheTimeout) {
  ChannelHandler ch(*h_);
  absl::Status joined_a = absl::UnknownError("pending");
  h_->Join(GoodJoin("a"), "p", h_->NewTicket(),
           [&](const absl::Status& s, const v1::JoinResponse&) { joined_a = s; });
  ASSERT_TRUE(JoinNow(GoodJoin("b")).ok());
  ASSERT_TRUE(joined_a.ok());
  const v1::Auth auth = GoodJoin("x").auth();
  auto heartbeat = [&](const std::string& id) {
    v1::PublishRequest pub;
    *pub.mutable_auth() = auth;
    pub.set_node_id(id);
    v1::PublishResponse resp;
    EXPECT_TRUE(ch.Publish(pub, "p", &resp).ok());
    return resp.diagnostics_request();
  };
  auto post = [&](uint64_t id, const std::string& node) {
    v1::PostStacksRequest p;
    *p.mutable_auth() = auth;
    p.set_request_id(id);
    p.mutable_stacks()->set_node_id(node);
    p.mutable_stacks()->set_hostname("h" + node);
    p.mutable_stacks()->set_ranks_json("[]");
    return ch.PostDiagnostics(p, "p");
  };
  EXPECT_EQ(heartbeat("a"), 0u);  // nothing asked yet

  v1::StacksRequest req;
  *req.mutable_auth() = auth;
  req.set_timeout_ms(2000);
  int calls = 0;
  v1::StacksResponse got;
  ch.CollectDiagnostics(req, "p", [&](const absl::Status& s, const v1::StacksResponse& r) {
    ++calls;
    EXPECT_TRUE(s.ok()) << s;
    got = r;
  });
  const uint64_t id = heartbeat("a");
  ASSERT_GT(id, 0u);
  EXPECT_EQ(heartbeat("b"), id);
  ASSERT_TRUE(post(id, "a").ok());
  EXPECT_EQ(heartbeat("a"), 0u);  // a has answered
  EXPECT_EQ(calls, 0);            // b has not
  ASSERT_TRUE(post(id, "b").ok());
  ASSERT_EQ(calls, 1);
  EXPECT_EQ(got.nodes_size(), 2);
  EXPECT_EQ(got.missing_size(), 0);
  EXPECT_TRUE(post(id, "b").ok());  // late: changes nothing
  EXPECT_EQ(calls, 1);

  // b never answers this time: at the timeout the call ends, naming it.
  ch.CollectDiagnostics(req, "p", [&](const absl::Status& s, const v1::StacksResponse& r) {
    ++calls;
    got = r;
  });
  const uint64_t id2 = heartbeat("a");
  ASSERT_TRUE(post(id2, "a").ok());
  std::optional<TimePoint> next = ch.Tick();
  ASSERT_TRUE(next.has_value());
  EXPECT_LE(*next, now_ + std::chrono::milliseconds(2000));
  EXPECT_EQ(calls, 1);
  now_ += std::chrono::milliseconds(2001);
  ch.Tick();
  ASSERT_EQ(calls, 2);
  ASSERT_EQ(got.missing_size(), 1);
  EXPECT_EQ(got.missing(0).hostname(), "hb");

  v1::StacksRequest bad = req;
  bad.mutable_auth()->set_token("wrong-token-x");
  absl::Status refused;
  ch.CollectDiagnostics(bad, "p", [&](const absl::Status& s, const v1::StacksResponse&) {
    refused = s;
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
}

// `dlrun profile` rides on the stacks collection: the Publish answer carries the ask; a request
// with a tool that cannot attach, no ranks, or a duration the timeout does not cover is
// refused, naming the field.
TEST_F(HandlerTest, AProfileRequestIsAskedOnPublishesAndABadOneIsRefusedNamingTheField) {
  ChannelHandler ch(*h_);
  absl::Status joined_a = absl::UnknownError("pending");
  h_->Join(GoodJoin("a"), "p", h_->NewTicket(),
           [&](const absl::Status& s, const v1::JoinResponse&) { joined_a = s; });
  ASSERT_TRUE(JoinNow(GoodJoin("b")).ok());
  ASSERT_TRUE(joined_a.ok());
  const v1::Auth auth = GoodJoin("x").auth();
  v1::StacksRequest req;
  *req.mutable_auth() = auth;
  req.set_timeout_ms(20000);
  req.mutable_profile()->set_tool("perf");
  req.mutable_profile()->add_ranks(3);
  req.mutable_profile()->set_duration_ms(10000);
  req.mutable_profile()->set_args("-F 499");
  int calls = 0;
  ch.CollectDiagnostics(req, "p", [&](const absl::Status& s, const v1::StacksResponse&) { ++calls; });
  v1::PublishRequest pub;
  *pub.mutable_auth() = auth;
  pub.set_node_id("a");
  v1::PublishResponse resp;
  ASSERT_TRUE(ch.Publish(pub, "p", &resp).ok());
  EXPECT_GT(resp.diagnostics_request(), 0u);
  ASSERT_TRUE(resp.has_profile());
  EXPECT_EQ(resp.profile().tool(), "perf");
  EXPECT_EQ(resp.profile().ranks_size(), 1);
  EXPECT_EQ(resp.profile().ranks(0), 3u);
  EXPECT_EQ(resp.profile().duration_ms(), 10000u);
  EXPECT_EQ(resp.profile().args(), "-F 499");
  EXPECT_EQ(calls, 0);

  auto refused = [&](auto mutate) {
    v1::StacksRequest bad = req;
    mutate(&bad);
    absl::Status got;
    ch.CollectDiagnostics(bad, "p", [&](const absl::Status& s, const v1::StacksResponse&) { got = s; });
    EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << got;
    return std::string(got.message());
  };
  EXPECT_EQ(refused([](v1::StacksRequest* r) { r->mutable_profile()->set_tool("nsys"); }),
            "profile.tool 'nsys': expected py-spy or perf");
  EXPECT_EQ(refused([](v1::StacksRequest* r) { r->mutable_profile()->clear_ranks(); }),
            "profile.ranks has 0 ranks: expected 1 to 4096");
  EXPECT_EQ(refused([](v1::StacksRequest* r) { r->mutable_profile()->set_duration_ms(20000); }),
            "profile.duration_ms 20000: expected 1 to below timeout_ms (20000)");
  EXPECT_EQ(refused([](v1::StacksRequest* r) { r->mutable_profile()->set_args(std::string(2000, 'x')); }),
            "profile.args has 2000 bytes: expected at most 1024");
  EXPECT_EQ(refused([](v1::StacksRequest* r) { r->mutable_profile()->add_ranks(5000000); }),
            "profile.ranks holds 5000000: not a rank");
}

}  // namespace
}  // namespace dlrun::rdzv
