// The rendezvous as the agent's membership source, on a fake clock and a scripted client: when
// a silent host counts as lost (the liveness limit), and whether the agent then stops or fails
// over. Real gRPC and real agents: tests/multiproc/dlrun_failover_test.cc.
#include "launcher/rdzv/rdzv_source.h"

#include <deque>
#include <memory>

#include "agent/fakes.h"
#include "gtest/gtest.h"
#include "rendezvous/client.h"

namespace dlrun::launcher {
namespace {

using std::chrono::milliseconds;

// Joins succeed at once with `join`; heartbeats answer as `heartbeat_ok` says at the time.
struct Script {
  rdzv::JoinResult join;
  bool heartbeat_ok = true;
  int heartbeats = 0;
  // The job channel: each Publish's figures (null: none new), and what it answers.
  std::vector<std::optional<telemetry::NodeTelemetry>> publishes;
  rdzv::DiagnosticsAsk ask;
  std::vector<uint64_t> posted;
};

class ScriptedClient final : public rdzv::RendezvousClient {
 public:
  ScriptedClient(Script& s, std::string endpoint) : s_(s), endpoint_(std::move(endpoint)) {}
  absl::StatusOr<rdzv::JoinResult> Join(const rdzv::NodeInfo&, rdzv::Duration) override {
    return s_.join;
  }
  absl::StatusOr<rdzv::HeartbeatReply> Heartbeat(const std::string&, uint64_t, bool) override {
    ++s_.heartbeats;
    if (!s_.heartbeat_ok) return absl::UnavailableError("connection refused");
    return rdzv::HeartbeatReply{};
  }
  absl::StatusOr<rdzv::FailureReply> ReportFailure(const std::string&, uint64_t,
                                                   const std::string&, bool, bool) override {
    return rdzv::FailureReply{};
  }
  absl::Status Leave(const std::string&, uint64_t, bool) override { return absl::OkStatus(); }
  absl::StatusOr<rdzv::DiagnosticsAsk> Publish(const std::string&,
                                               const telemetry::NodeTelemetry* t) override {
    s_.publishes.push_back(t ? std::optional(*t) : std::nullopt);
    return s_.ask;
  }
  absl::Status PostDiagnostics(uint64_t id, const rdzv::NodeStacksReply&) override {
    s_.posted.push_back(id);
    return absl::OkStatus();
  }
  absl::StatusOr<rdzv::StatusSnapshot> Status(rdzv::Duration) override {
    return absl::UnavailableError("not scripted");
  }
  void set_epoch(uint64_t) override {}
  const std::string& endpoint() const override { return endpoint_; }

 private:
  Script& s_;
  std::string endpoint_;
};

class ScriptedApi final : public rdzv::Api {
 public:
  explicit ScriptedApi(Script& s) : s_(s) {}
  int Serve(const rdzv::HostOptions&) override { return 2; }
  std::unique_ptr<rdzv::RendezvousClient> CreateClient(const rdzv::ClientOptions& o) override {
    return std::make_unique<ScriptedClient>(s_, o.endpoint);
  }
  absl::StatusOr<std::unique_ptr<rdzv::HostedRendezvous>> Host(const rdzv::HostOptions&) override {
    return absl::UnavailableError("not scripted");
  }
  absl::StatusOr<std::unique_ptr<telemetry::MetricsServer>> ServeMetrics(
      std::shared_ptr<telemetry::JobTelemetry>, const std::string&, int) override {
    return absl::UnavailableError("not scripted");
  }

 private:
  Script& s_;
};

struct Fixture {
  Script script;
  ScriptedApi api{script};
  testing::FakeClock clock;
  RdzvSourceOptions options;
  std::shared_ptr<MembershipSource> source;
  std::shared_ptr<JobChannel> channel;

  // A round of `nodes` (this one node rank `node_rank`); `successor`: another node may take
  // over the rendezvous.
  explicit Fixture(bool successor, int nodes = 2, int node_rank = 0) {
    options.endpoint = "10.9.9.9:29400";
    options.hostname = "node-a";
    options.is_host = "false";
    options.config.heartbeat_interval = milliseconds(1000);
    options.config.heartbeat_misses = 5;
    script.join.assignment.round = 1;
    script.join.assignment.num_nodes = nodes;
    script.join.assignment.node_rank = node_rank;
    script.join.assignment.world_size = nodes;
    if (successor) script.join.successors.push_back({"node-b:42", "10.9.9.10"});
    auto s = MakeRendezvousSource(options, api, clock);
    EXPECT_TRUE(s.ok()) << s.status();
    source = s->membership;
    channel = s->channel;
    auto a = source->Next();
    EXPECT_TRUE(a.ok()) << a.status();
  }
  void Advance(milliseconds d) { clock.Set(clock.Now() + d); }
};

TEST(RdzvSourceLiveness, ASilentHostIsLostAtTheLivenessLimitNotBefore) {
  Fixture f(/*successor=*/false);
  std::string reason;
  f.script.heartbeat_ok = false;
  f.Advance(milliseconds(4999));
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kContinue);
  f.Advance(milliseconds(1));
  // No other node can host: the job stops, naming the host and how long it was silent.
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kStop);
  EXPECT_NE(reason.find("the rendezvous host at 10.9.9.9:29400 has not answered for 5000 ms"),
            std::string::npos)
      << reason;
}

TEST(RdzvSourceLiveness, AnAnswerRestartsTheSilenceCount) {
  Fixture f(/*successor=*/false);
  std::string reason;
  f.Advance(milliseconds(3000));
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kContinue);  // answered
  f.script.heartbeat_ok = false;
  f.Advance(milliseconds(4999));  // 7999 ms since the round began, 4999 since the answer
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kContinue);
  f.Advance(milliseconds(1));
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kStop);
  EXPECT_EQ(f.script.heartbeats, 3);
}

TEST(RdzvSourceLiveness, WithASuccessorALostHostMeansFailover) {
  Fixture f(/*successor=*/true);
  std::string reason;
  f.script.heartbeat_ok = false;
  f.Advance(milliseconds(5000));
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kRestart);
  EXPECT_NE(reason.find("has not answered for 5000 ms"), std::string::npos) << reason;
  EXPECT_NE(reason.find(": failing over"), std::string::npos) << reason;
  // Until the failover (the next Next()), the verdict stays a restart without asking the host.
  const int asked = f.script.heartbeats;
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kRestart);
  EXPECT_EQ(f.script.heartbeats, asked);
}

// The job channel rides beside membership: one exchange per answered heartbeat, with the
// node's figures only when they are new, and the job's ask in return until it is answered.
TEST(RdzvJobChannel, SendsNewFiguresOnceAndSurfacesTheJobsAsk) {
  Fixture f(/*successor=*/false);
  std::string reason;
  telemetry::NodeTelemetry t;
  t.hostname = "node-a";
  f.channel->Publish(t);
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kContinue);
  f.script.ask.request = 7;
  EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kContinue);
  ASSERT_EQ(f.script.publishes.size(), 2u);
  ASSERT_TRUE(f.script.publishes[0].has_value());
  EXPECT_EQ(f.script.publishes[0]->hostname, "node-a");
  EXPECT_FALSE(f.script.publishes[1].has_value()) << "unchanged figures are not sent again";
  EXPECT_EQ(f.channel->DiagnosticsWanted().id, 7u);
  EXPECT_FALSE(f.channel->DiagnosticsWanted().profile.has_value());
  f.channel->PostDiagnostics(7, "[]");
  EXPECT_EQ(f.script.posted, std::vector<uint64_t>{7});
  EXPECT_EQ(f.channel->DiagnosticsWanted().id, 0u) << "an answered ask is not asked again";
  // A heartbeat the host did not answer carries no exchange.
  f.script.heartbeat_ok = false;
  f.Advance(milliseconds(1000));
  f.source->Check(&reason);
  EXPECT_EQ(f.script.publishes.size(), 2u);
}

// In a job of thousands of nodes each node publishes after every few heartbeats, in turn by
// node rank, so the host's load per interval stays about rdzv::kPublishesPerBeat calls; the
// last figures still precede the leave.
TEST(RdzvJobChannel, ABigJobsNodesPublishInTurn) {
  EXPECT_EQ(rdzv::PublishEvery(2), 1);
  EXPECT_EQ(rdzv::PublishEvery(rdzv::kPublishesPerBeat), 1);
  EXPECT_EQ(rdzv::PublishEvery(rdzv::kPublishesPerBeat + 1), 2);
  EXPECT_EQ(rdzv::PublishEvery(4 * rdzv::kPublishesPerBeat), 4);
  Fixture f(/*successor=*/false, /*nodes=*/4 * rdzv::kPublishesPerBeat, /*node_rank=*/4093);
  std::string reason;
  std::vector<size_t> after;  // the publishes made so far, after each heartbeat
  for (int beat = 0; beat < 8; ++beat) {
    f.Advance(milliseconds(1000));
    EXPECT_EQ(f.source->Check(&reason), MembershipSource::Verdict::kContinue);
    after.push_back(f.script.publishes.size());
  }
  // Node rank 4093 of 4096: 4093 % 4 == 1, so after heartbeats 1 and 5.
  EXPECT_EQ(after, (std::vector<size_t>{0, 1, 1, 1, 1, 2, 2, 2}));
  f.source->OnSuccess();
  EXPECT_EQ(f.script.publishes.size(), 3u) << "the last figures go before the leave";
  // Every node publishes once in each run of PublishEvery beats.
  for (int rank = 0; rank < 8; ++rank) {
    int times = 0;
    for (uint64_t beat = 0; beat < 4; ++beat) times += rdzv::PublishesAfter(beat, rank, 4096);
    EXPECT_EQ(times, 1) << "node rank " << rank;
  }
}

}  // namespace
}  // namespace dlrun::launcher
