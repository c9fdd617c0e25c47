// One rendezvous configuration: --rdzv-conf keys, the token rule, and the same liveness limit
// for a hosted rendezvous and `dlrun rdzv-server`.
#include "launcher/cli/job_token.h"

#include <map>

#include "fake_env.h"
#include "gtest/gtest.h"
#include "launcher/cli/rdzv_conf.h"
#include "launcher/cli/rdzv_server_cli.h"
#include "launcher/rdzv/rdzv_source.h"

namespace dlrun::launcher {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return dlrun::testing::FakeEnv(std::move(vars));
}

// --rdzv-conf as the options hold it: parsed, then applied to a rendezvous configuration.
absl::Status ApplyRdzvConf(const std::string& text, rdzv::Config* c, std::string* is_host) {
  auto conf = ParseRdzvConf(text);
  if (!conf.ok()) return conf.status();
  conf->ApplyTo(c);
  *is_host = conf->is_host;
  return absl::OkStatus();
}

TEST(RdzvConf, KeysAndErrors) {
  rdzv::Config c;
  std::string is_host = "auto";
  ASSERT_TRUE(ApplyRdzvConf("join_timeout=10,last_call_timeout=2.5,heartbeat_interval=0.5,"
                            "heartbeat_misses=4,is_host=false,read_timeout=60",
                            &c, &is_host)
                  .ok());
  EXPECT_EQ(c.join_timeout.count(), 10000);
  EXPECT_EQ(c.last_call.count(), 2500);
  EXPECT_EQ(c.heartbeat_interval.count(), 500);
  EXPECT_EQ(c.heartbeat_misses, 4);
  EXPECT_EQ(is_host, "false");
  auto s = ApplyRdzvConf("join_timeout=-1", &c, &is_host);
  EXPECT_EQ(std::string(s.message()),
            "invalid value '-1' for join_timeout in --rdzv-conf: expected seconds > 0");
  s = ApplyRdzvConf("bogus=1", &c, &is_host);
  EXPECT_NE(std::string(s.message()).find("unknown key 'bogus'"), std::string::npos);
  EXPECT_EQ(std::string(ApplyRdzvConf("novalue", &c, &is_host).message()),
            "invalid item 'novalue' in --rdzv-conf: expected KEY=VALUE");
}

TEST(RdzvConf, TorchrunsKeysMapToDlrunsOrAreAccepted) {
  rdzv::Config c;
  std::string is_host;
  ASSERT_TRUE(ApplyRdzvConf("keep_alive_interval=2,keep_alive_max_attempt=4,store_type=tcp,"
                            "use_libuv=1,close_timeout=30,timeout=900",
                            &c, &is_host)
                  .ok());
  EXPECT_EQ(c.heartbeat_interval.count(), 2000);
  EXPECT_EQ(c.heartbeat_misses, 4);
  ASSERT_TRUE(ApplyRdzvConf("heartbeat_timeout=9", &c, &is_host).ok());
  EXPECT_EQ(c.heartbeat_misses, 5);  // 9 s at 2 s a heartbeat: 5 intervals
  EXPECT_EQ(c.liveness_limit().count(), 10000);
}

TEST(RdzvToken, OneRuleForHostedAndStandAlone) {
  EXPECT_EQ(*JobToken(Env({}), "job7"), "run-id:job7");  // unset: allowed, with a warning
  EXPECT_EQ(*JobToken(Env({{"DLRUN_RDZV_TOKEN", ""}}), "job7"), "run-id:job7");
  EXPECT_EQ(*JobToken(Env({{"DLRUN_RDZV_TOKEN", "12345678"}}), "j"), "12345678");
  auto bad = JobToken(Env({{"DLRUN_RDZV_TOKEN", "short"}}), "j");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("at least 8"), std::string::npos);
  // `dlrun rdzv-server` applies the same rule.
  auto server = ParseRdzvServerArgs({"--run-id", "j"}, Env({{"DLRUN_RDZV_TOKEN", "short"}}));
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().message(), bad.status().message());
  server = ParseRdzvServerArgs({"--run-id", "j"}, Env({}));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->host.token, "run-id:j");
}

TEST(RdzvLiveness, HostedAndStandAloneDeclareASilentNodeDeadAfterTheSameTime) {
  RdzvSourceOptions hosted;  // what an agent hosting the rendezvous runs it with
  auto server = ParseRdzvServerArgs({"--nnodes", "2"}, Env({{"DLRUN_RDZV_TOKEN", "12345678"}}));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(hosted.config.liveness_limit(), server->host.config.liveness_limit());
  EXPECT_EQ(hosted.config.heartbeat_interval, server->host.config.heartbeat_interval);
  EXPECT_EQ(hosted.config.heartbeat_misses, server->host.config.heartbeat_misses);
  EXPECT_EQ(hosted.config.liveness_limit(), std::chrono::seconds(5));
  // The same keys change both.
  std::string is_host;
  ASSERT_TRUE(ApplyRdzvConf("heartbeat_interval=2,heartbeat_misses=3", &hosted.config, &is_host).ok());
  server = ParseRdzvServerArgs({"--heartbeat-interval", "2", "--heartbeat-misses", "3"},
                               Env({{"DLRUN_RDZV_TOKEN", "12345678"}}));
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(hosted.config.liveness_limit(), server->host.config.liveness_limit());
}

TEST(RdzvServerArgs, FlagsAndErrors) {
  const auto env = Env({{"DLRUN_RDZV_TOKEN", "12345678"}});
  auto a = ParseRdzvServerArgs({"--host", "::1", "--port", "0", "--nnodes=2:4", "--run-id", "x",
                                "--max-restarts", "3", "--last-call", "1.5"},
                               env);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host.listen_address, "[::1]:0");
  EXPECT_EQ(a->host.config.min_nodes, 2);
  EXPECT_EQ(a->host.config.max_nodes, 4);
  EXPECT_EQ(a->host.config.max_restarts, 3);
  EXPECT_EQ(a->host.config.last_call.count(), 1500);
  EXPECT_EQ(a->host.run_id, "x");
  EXPECT_EQ(std::string(ParseRdzvServerArgs({"--nnodes", "3:1"}, env).status().message()),
            "invalid value '3:1' for --nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX");
  EXPECT_NE(std::string(ParseRdzvServerArgs({"--bogus"}, env).status().message())
                .find("unknown flag '--bogus' for dlrun rdzv-server"),
            std::string::npos);
  EXPECT_FALSE(ParseRdzvServerArgs({"stray"}, env).ok());
  EXPECT_TRUE(ParseRdzvServerArgs({"--help"}, env)->help);
}

}  // namespace
}  // namespace dlrun::launcher
