// Two dlrun agents on this machine meet at the gRPC rendezvous (one hosts it in-process),
// as two nodes would: ranks, restarts after a worker failure, and DDP training across them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

constexpr auto kMultiNodeDeadline = std::chrono::seconds(120);

struct TwoNodes {
  int rc[2] = {-1, -1};
  std::string out[2];
};

// Runs the same dlrun command as two agents (nodes) against one rendezvous endpoint.
TwoNodes RunTwoNodes(const std::vector<std::string>& program, const std::string& extra_conf = "",
                     int max_restarts = 0, const std::vector<std::string>& extra_flags = {},
                     const std::map<std::string, std::string>& extra_env = {}) {
  const std::string endpoint = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::string> cmd = {DLRUN_BIN,       "--nnodes",          "2",
                                  "--nproc-per-node", "2",              "--rdzv-backend",
                                  "c10d",          "--rdzv-endpoint",   endpoint,
                                  "--rdzv-id",     "test-job",          "--max-restarts",
                                  std::to_string(max_restarts),        "--rdzv-conf",
                                  "heartbeat_interval=0.1,join_timeout=60" + extra_conf};
  cmd.insert(cmd.end(), extra_flags.begin(), extra_flags.end());
  cmd.insert(cmd.end(), program.begin(), program.end());
  std::map<std::string, std::string> env = {{"DLRUN_RDZV_TOKEN", "test-token-123"},
                                            {"OMP_NUM_THREADS", "1"}};
  env.insert(extra_env.begin(), extra_env.end());
  Started a = StartCommand(cmd, env);
  Started b = StartCommand(cmd, env);
  TwoNodes r;
  r.rc[0] = FinishCommand(a, kMultiNodeDeadline);
  r.rc[1] = FinishCommand(b, kMultiNodeDeadline);
  r.out[0] = a.output;
  r.out[1] = b.output;
  return r;
}

// Every rank 0..3 recorded restart count 1 in DIR/attempts.RANK: both nodes restarted.
void ExpectEveryRankRanRestart1(const std::string& dir) {
  for (int rank = 0; rank < 4; ++rank) {
    const std::string attempts = ReadFile(dir + "/attempts." + std::to_string(rank));
    EXPECT_NE(attempts.find("1\n"), std::string::npos) << "rank " << rank << ": " << attempts;
  }
}

// A rendezvous that cannot be reached says so: a host name that does not resolve is one line
// and exit 1 at once; a join held for a missing node says every 15 s what it waits for.
TEST(DlrunMultiNode, AnUnresolvableEndpointFailsAtOnceAndAWaitingJoinSaysWhatItWaitsFor) {
  const auto start = std::chrono::steady_clock::now();
  ProcResult r = RunCommand({DLRUN_BIN, "--nnodes", "2", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", "nosuchhost.invalid:29400", "--rdzv-id", "x",
                             "/bin/true"},
                            {{"DLRUN_RDZV_TOKEN", "test-token-123"}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.rfind("dlrun: the rendezvous endpoint nosuchhost.invalid:29400: cannot "
                           "resolve 'nosuchhost.invalid': ", 0),
            0u)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));

  const std::string endpoint = absl::StrCat("127.0.0.1:", FreeTcpPort());
  Started alone = StartCommand({DLRUN_BIN, "--nnodes", "2", "--rdzv-backend", "c10d",
                                "--rdzv-endpoint", endpoint, "--rdzv-id", "x", "/bin/true"},
                               {{"DLRUN_RDZV_TOKEN", "test-token-123"}});
  EXPECT_TRUE(ReadUntil(alone, "waiting for 1 more node(s) at " + endpoint + ", 1 of 2 joined (",
                        1, std::chrono::seconds(60)))
      << alone.output;
  kill(alone.pid, SIGTERM);
  EXPECT_NE(FinishCommand(alone, kMultiNodeDeadline), 0);
}

// The static rendezvous: a master address that does not resolve is one line and exit 1 before any
// worker starts (the workers would otherwise retry it until their store's timeout).
TEST(DlrunMultiNode, AnUnresolvableMasterAddressOfTheStaticRendezvousFailsBeforeTheWorkers) {
  const auto start = std::chrono::steady_clock::now();
  ProcResult r = RunCommand({DLRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-addr",
                             "nosuchhost.invalid", "--master-port", "29500", "/bin/echo",
                             "a worker started"},
                            {});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.rfind("dlrun: the master address (--master-addr or MASTER_ADDR: ", 0), 0u)
      << r.output;
  EXPECT_NE(r.output.find("cannot resolve 'nosuchhost.invalid': "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("a worker started"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));

  // torchrun's form, node 0's HOST:PORT as the static endpoint: the line names that flag, and an
  // endpoint that is not one HOST[:PORT] is a usage error (exit 2) before anything starts.
  r = RunCommand({DLRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                  "nosuchhost.invalid:29500", "/bin/echo", "a worker started"},
                 {});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.rfind("dlrun: the master address (--rdzv-endpoint's host: ", 0), 0u)
      << r.output;
  r = RunCommand({DLRUN_BIN, "--nnodes", "2", "--rdzv-endpoint", "localhost:99999", "/bin/echo",
                  "a worker started"},
                 {});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "dlrun: invalid value 'localhost:99999' for --rdzv-endpoint: expected node "
            "0's HOST[:PORT] with a port 0-65535 (the static rendezvous, where the "
            "workers' store listens; a list of endpoints needs --rdzv-backend c10d)\n");
}

// A rendezvous endpoint whose port another program holds (it takes TCP connections, never
// speaks gRPC) is said in the first seconds, not as "is the port open?" every 15 s.
TEST(DlrunMultiNode, AnEndpointThatAnotherProgramHoldsIsSaidInSeconds) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 64), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string endpoint = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  std::thread greeter([fd] {  // until the listening socket is shut down
    for (int c; (c = accept(fd, nullptr, nullptr)) >= 0; close(c)) {
      static const char kBanner[] = "SSH-2.0-OpenSSH_9.2\r\n";
      (void)!write(c, kBanner, sizeof kBanner - 1);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  Started s = StartCommand({DLRUN_BIN, "--nnodes", "2", "--rdzv-backend", "c10d",
                            "--rdzv-endpoint", endpoint, "--rdzv-id", "x", "/bin/true"},
                           {{"DLRUN_RDZV_TOKEN", "test-token-123"}});
  EXPECT_TRUE(ReadUntil(s, "; another program holds it, or the endpoint names the wrong port)",
                        1, std::chrono::seconds(30)))
      << s.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(12)) << s.output;
  EXPECT_EQ(s.output.find("is the port open?"), std::string::npos) << s.output;
  // What answered is named: this test's process, which greets every connection as sshd does.
  std::string comm = ReadFile("/proc/self/comm");
  comm = comm.substr(0, comm.find('\n'));
  EXPECT_NE(s.output.find(absl::StrCat("(the port answers, but not as a dlrun rendezvous: ", comm,
                                       " (pid ", getpid(), ") on this host, which said "
                                       "'SSH-2.0-OpenSSH_9.2'")),
            std::string::npos)
      << s.output;
  // Told to host it there (is_host=true): dlrun's one line, without gRPC's raw one beside it
  // ("chttp2_server.cc ... No address added out of total 1 resolved").
  ProcResult h = RunCommand({DLRUN_BIN, "--nnodes", "2", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", endpoint, "--rdzv-id", "x", "--rdzv-conf",
                             "is_host=true", "/bin/true"},
                            {{"DLRUN_RDZV_TOKEN", "test-token-123"}}, kMultiNodeDeadline);
  EXPECT_NE(h.exit_code, 0);
  EXPECT_NE(h.output.find("cannot listen on 127.0.0.1:"), std::string::npos) << h.output;
  EXPECT_EQ(h.output.find("No address added"), std::string::npos) << h.output;
  EXPECT_EQ(h.output.find("chttp2"), std::string::npos) << h.output;
  kill(s.pid, SIGTERM);
  EXPECT_NE(FinishCommand(s, kMultiNodeDeadline), 0);
  shutdown(fd, SHUT_RDWR);
  close(fd);
  greeter.join();
}

TEST(DlrunMultiNode, TwoAgentsTimesTwoWorkersGetRanks0To3ExactlyOnce) {
  const std::string dir = MakeTempDir();
  TwoNodes r = RunTwoNodes(
      {"sh", "-c", "echo $RANK $WORLD_SIZE $GROUP_RANK $LOCAL_RANK $MASTER_PORT > " + dir +
                       "/rank.$RANK.$$"});
  ASSERT_EQ(r.rc[0], 0) << r.out[0];
  ASSERT_EQ(r.rc[1], 0) << r.out[1];
  std::multiset<int> ranks;
  std::set<std::string> ports;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::vector<std::string> v = absl::StrSplit(absl::StripAsciiWhitespace(ReadFile(f.path())), ' ');
    ASSERT_EQ(v.size(), 5u);
    ranks.insert(std::stoi(v[0]));
    EXPECT_EQ(v[1], "4");
    EXPECT_EQ(std::stoi(v[0]), std::stoi(v[2]) * 2 + std::stoi(v[3]));  // node-major ranks
    ports.insert(v[4]);
  }
  EXPECT_EQ(ranks, (std::multiset<int>{0, 1, 2, 3}));
  EXPECT_EQ(ports.size(), 1u);
  // One agent hosted the rendezvous; both printed their rank table.
  EXPECT_NE((r.out[0] + r.out[1]).find("hosting the rendezvous"), std::string::npos);
  EXPECT_NE(r.out[0].find("world size 4"), std::string::npos) << r.out[0];
}

// The job's TLS files, as a job script would export them (tests/rdzv/testdata).
std::map<std::string, std::string> TlsEnv(const std::string& cert = "node") {
  const std::string d = std::string(SOURCE_DIR) + "/tests/rdzv/testdata/";
  return {{"DLRUN_RDZV_TLS_CA", d + "ca.pem"},
          {"DLRUN_RDZV_TLS_CERT", d + cert + ".pem"},
          {"DLRUN_RDZV_TLS_KEY", d + cert + ".key"},
          {"DLRUN_RDZV_TLS_SERVER_NAME", "dlrun-rdzv"}};
}

TEST(DlrunMultiNode, TwoAgentsMeetOverMutualTls) {
  const std::string dir = MakeTempDir();
  TwoNodes r = RunTwoNodes({"sh", "-c", "echo $RANK > " + dir + "/rank.$RANK"}, "", 0, {},
                           TlsEnv());
  ASSERT_EQ(r.rc[0], 0) << r.out[0];
  ASSERT_EQ(r.rc[1], 0) << r.out[1];
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(ReadFile(dir + "/rank." + std::to_string(rank)), std::to_string(rank) + "\n");
  }
  EXPECT_NE((r.out[0] + r.out[1]).find("hosting the rendezvous on 127.0.0.1:"), std::string::npos);
  EXPECT_NE((r.out[0] + r.out[1]).find("(mutual TLS)"), std::string::npos);
}

TEST(DlrunMultiNode, AnAgentWithoutTheJobsCertificateCannotJoin) {
  // A TLS rendezvous hosted by the first agent; an agent with the token but a rogue
  // certificate never gets in (its join times out), and the job does not start without it.
  const std::string endpoint = absl::StrCat("127.0.0.1:", FreeTcpPort());
  auto cmd = [&](const char* join_timeout) {
    return std::vector<std::string>{DLRUN_BIN, "--nnodes", "2", "--nproc-per-node", "1",
                                    "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                                    "--rdzv-id", "tls-job", "--rdzv-conf",
                                    std::string("heartbeat_interval=0.1,join_timeout=") + join_timeout,
                                    "true"};
  };
  auto env = TlsEnv();
  env["DLRUN_RDZV_TOKEN"] = "test-token-123";
  Started host = StartCommand(cmd("8"), env);
  ASSERT_TRUE(ReadUntil(host, "hosting the rendezvous", 1, std::chrono::seconds(30))) << host.output;
  auto rogue_env = TlsEnv("rogue");
  rogue_env["DLRUN_RDZV_TOKEN"] = "test-token-123";
  ProcResult rogue = RunCommand(cmd("3"), rogue_env, std::chrono::seconds(60));
  EXPECT_NE(rogue.exit_code, 0) << rogue.output;
  EXPECT_EQ(rogue.output.find("world size"), std::string::npos) << rogue.output;
  EXPECT_NE(rogue.output.find("does it use this job's TLS CA and certificates?"), std::string::npos)
      << rogue.output;
  const int rc = FinishCommand(host, std::chrono::seconds(60));
  EXPECT_NE(rc, 0) << host.output;
  EXPECT_EQ(host.output.find("world size"), std::string::npos) << host.output;  // never started
}

TEST(DlrunMultiNode, WorkerFailureRestartsBothNodesWithTheSameRestartCount) {
  const std::string dir = MakeTempDir();
  // Rank 3 fails on the first attempt only; every attempt records its restart count.
  TwoNodes r = RunTwoNodes(
      {"sh", "-c",
       "echo $TORCHELASTIC_RESTART_COUNT >> " + dir +
           "/attempts.$RANK; if [ $RANK = 3 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 5; "
           "fi; exit 0"},
      "", /*max_restarts=*/1);
  EXPECT_EQ(r.rc[0], 0) << r.out[0] << r.out[1];
  EXPECT_EQ(r.rc[1], 0) << r.out[1] << r.out[0];
  ExpectEveryRankRanRestart1(dir);
  EXPECT_NE((r.out[0] + r.out[1]).find("exit code 5"), std::string::npos);
}

TEST(DlrunMultiNode, ASlowStopDoesNotGetALiveNodeDeclaredDead) {
  // On the first attempt rank 3 fails once rank 2 (same node) ignores SIGTERM, so that node's
  // agent spends the whole 2 s grace period stopping it: 4x the heartbeat limit (0.1 s x 5). The
  // agent must keep heartbeating meanwhile; both nodes then restart and the job succeeds.
  const std::string dir = MakeTempDir();
  TwoNodes r = RunTwoNodes(
      {"sh", "-c",
       "echo $TORCHELASTIC_RESTART_COUNT >> " + dir +
           "/attempts.$RANK; if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then "
           "if [ $RANK = 3 ]; then for i in $(seq 2000); do [ -e " + dir + "/trapped ] && break; "
           "sleep 0.01; done; exit 5; fi; "
           "if [ $RANK = 2 ]; then trap '' TERM; touch " + dir + "/trapped; sleep 30; fi; fi; "
           "exit 0"},
      "", /*max_restarts=*/1, {"--grace-period", "2"});
  EXPECT_EQ(r.rc[0], 0) << r.out[0] << r.out[1];
  EXPECT_EQ(r.rc[1], 0) << r.out[1] << r.out[0];
  const std::string all = r.out[0] + r.out[1];
  EXPECT_NE(all.find("did not stop within 2000 ms: SIGKILL"), std::string::npos) << all;
  ExpectEveryRankRanRestart1(dir);
}

TEST(DlrunMultiNode, NoRestartsLeftFailsBothNodes) {
  TwoNodes r = RunTwoNodes({"sh", "-c", "if [ $RANK = 0 ]; then exit 9; fi; exec sleep 600"});
  EXPECT_NE(r.rc[0], 0);
  EXPECT_NE(r.rc[1], 0);
  const std::string all = r.out[0] + r.out[1];
  EXPECT_NE(all.find("rank 0 (local rank 0"), std::string::npos) << all;
  EXPECT_NE(all.find("no restarts left"), std::string::npos) << all;
}

TEST(DlrunMultiNode, TrainUnetAcrossTwoAgentsKeepsParametersIdentical) {
  const std::string metrics = MakeTempDir() + "/m.json";
  TwoNodes r = RunTwoNodes({TRAIN_UNET_BIN, "--synthetic", "--base-channels", "4", "--max-steps",
                            "2", "--metrics-json", metrics});
  ASSERT_EQ(r.rc[0], 0) << r.out[0];
  ASSERT_EQ(r.rc[1], 0) << r.out[1];
  nlohmann::json m = nlohmann::json::parse(ReadFile(metrics));
  EXPECT_EQ(m["world_size"], 4);
  ASSERT_EQ(m["param_digests"].size(), 4u);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(m["param_digests"][i], m["param_digests"][0]);
}

}  // namespace
}  // namespace dlrun::testing
