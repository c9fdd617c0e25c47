// The POSIX side of the agent on its own: real fork/exec, pipes, the heartbeat pipe, signalfd.
#include "launcher/workers/posix_processes.h"

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"

namespace dlrun::launcher {
namespace {

// Waits (deadline 30 s) until `pid` has exited; collects heartbeats meanwhile.
ProcEvent WaitExit(Processes& p, pid_t pid, int* heartbeats) {
  const SteadyTime deadline = SystemClock().Now() + std::chrono::seconds(30);
  while (SystemClock().Now() < deadline) {
    for (const ProcEvent& e : p.Wait(deadline)) {
      if (e.kind == ProcEvent::Kind::kHeartbeat && e.pid == pid) ++*heartbeats;
      if (e.kind == ProcEvent::Kind::kExited && e.pid == pid) return e;
    }
  }
  ADD_FAILURE() << "pid " << pid << " did not exit within 30 s";
  return {};
}

TEST(PosixProcesses, ExitCodeOutputHeartbeatsAndEnvironment) {
  auto procs = PosixProcesses::Create({});
  ASSERT_TRUE(procs.ok()) << procs.status();
  const std::string d = dlrun::testing::MakeTempDir("posix");
  SpawnSpec spec;
  spec.argv = {"bash", "-c", "echo out-$MY_VAR; printf x >&$DLRUN_HEARTBEAT_FD; echo err >&2; exit 3"};
  spec.env = {{"MY_VAR", "v1"}};
  spec.out.log_path = d + "/out.log";
  spec.err.log_path = d + "/err.log";
  auto pid = (*procs)->Spawn(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  int heartbeats = 0;
  ProcEvent e = WaitExit(**procs, *pid, &heartbeats);
  EXPECT_EQ(e.exit_code, 3);
  EXPECT_EQ(e.signal, 0);
  EXPECT_EQ(heartbeats, 1);
  (*procs)->CloseOutputs();
  std::ifstream out(d + "/out.log"), err(d + "/err.log");
  std::string o((std::istreambuf_iterator<char>(out)), {}), r((std::istreambuf_iterator<char>(err)), {});
  EXPECT_EQ(o, "out-v1\n");
  EXPECT_EQ(r, "err\n");
  EXPECT_EQ((*procs)->ErrorTail(*pid), "err\n");  // what a failure's class is read from
  std::filesystem::remove_all(d);
}

// The memory cgroup's OOM kills: v1's memory.oom_control, else v2's memory.events, found
// through /proc/self/cgroup; on a fake tree, then (whichever the machine has) the real one.
TEST(PosixProcesses, TheCgroupsOomKillsAreReadForV1AndV2) {
  const std::string root = dlrun::testing::MakeTempDir("cg");
  std::filesystem::create_directories(root + "/memory/slurm/job_7");
  std::ofstream(root + "/memory/slurm/job_7/memory.oom_control")
      << "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
  EXPECT_EQ(ReadOomKills("12:cpuset:/slurm/job_7\n4:memory:/slurm/job_7\n", root), 3);
  std::filesystem::create_directories(root + "/user.slice/a");
  std::ofstream(root + "/user.slice/a/memory.events")
      << "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n";
  EXPECT_EQ(ReadOomKills("0::/user.slice/a\n", root), 1);
  EXPECT_EQ(ReadOomKills("0::/missing\n", root), -1);
  EXPECT_EQ(ReadOomKills("garbage", root), -1);
  std::filesystem::remove_all(root);
  auto procs = PosixProcesses::Create({});
  ASSERT_TRUE(procs.ok());
  // This machine: a count, or -1 without a memory cgroup.
  EXPECT_GE((*procs)->facts().OomKills(), -1);
}

// dlrun checks the program before the first spawn; one that goes away later still ends as a
// worker exit 127 with the reason on its stderr (as a shell's "command not found").
TEST(PosixProcesses, AProgramThatCannotBeExecutedExits127WithTheReason) {
  auto procs = PosixProcesses::Create({});
  ASSERT_TRUE(procs.ok()) << procs.status();
  const std::string d = dlrun::testing::MakeTempDir("posix");
  SpawnSpec spec;
  spec.argv = {d + "/gone"};
  spec.err.log_path = d + "/err.log";
  auto pid = (*procs)->Spawn(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  int heartbeats = 0;
  EXPECT_EQ(WaitExit(**procs, *pid, &heartbeats).exit_code, 127);
  (*procs)->CloseOutputs();
  std::ifstream err(d + "/err.log");
  std::string r((std::istreambuf_iterator<char>(err)), {});
  EXPECT_EQ(r, "dlrun: cannot execute '" + d + "/gone': No such file or directory\n");
  std::filesystem::remove_all(d);
}

TEST(PosixProcesses, SignalGroupReachesTheWorkerAndItsChildren) {
  auto procs = PosixProcesses::Create({});
  ASSERT_TRUE(procs.ok());
  SpawnSpec spec;
  spec.argv = {"sh", "-c", "sleep 60 & wait"};
  auto pid = (*procs)->Spawn(spec);
  ASSERT_TRUE(pid.ok());
  (*procs)->SignalGroup(*pid, SIGKILL);
  int heartbeats = 0;
  EXPECT_EQ(WaitExit(**procs, *pid, &heartbeats).signal, SIGKILL);
  (*procs)->CloseOutputs();  // returns: the sleeping child was in the group and died too
}

// What a worker does on a signal, as the kernel tells it: the agent stops a worker that ignores
// SIGINT with SIGTERM, and names the ranks with no handler for a passed-on SIGUSR1.
TEST(PosixProcesses, TheDispositionOfASignalIsReadFromTheKernel) {
  auto procs = PosixProcesses::Create({});
  ASSERT_TRUE(procs.ok());
  SpawnSpec spec;
  spec.argv = {"bash", "-c",
               "trap '' INT; trap 'echo usr1' USR1; printf x >&$DLRUN_HEARTBEAT_FD; "
               "while :; do sleep 0.1; done"};
  auto pid = (*procs)->Spawn(spec);
  ASSERT_TRUE(pid.ok());
  // The heartbeat comes after the traps are set.
  const SteadyTime deadline = SystemClock().Now() + std::chrono::seconds(30);
  bool beat = false;
  while (!beat && SystemClock().Now() < deadline) {
    for (const ProcEvent& e : (*procs)->Wait(deadline)) {
      beat = beat || (e.kind == ProcEvent::Kind::kHeartbeat && e.pid == *pid);
    }
  }
  ASSERT_TRUE(beat);
  using A = ProcessFacts::SignalAction;
  EXPECT_EQ((*procs)->facts().Disposition(*pid, SIGINT), A::kIgnored);
  EXPECT_EQ((*procs)->facts().Disposition(*pid, SIGUSR1), A::kCaught);
  EXPECT_EQ((*procs)->facts().Disposition(*pid, SIGUSR2), A::kDefault);
  EXPECT_EQ((*procs)->facts().Disposition(*pid, 0), A::kUnknown);
  (*procs)->SignalGroup(*pid, SIGKILL);
  int heartbeats = 0;
  EXPECT_EQ(WaitExit(**procs, *pid, &heartbeats).signal, SIGKILL);
  EXPECT_EQ((*procs)->facts().Disposition(*pid, SIGINT), A::kUnknown) << "reaped: no /proc entry";
  (*procs)->CloseOutputs();
}

TEST(PosixProcesses, WakeFromAnotherThreadEndsAWaitWithoutDeadline) {
  auto procs = PosixProcesses::Create({});
  ASSERT_TRUE(procs.ok());
  std::thread t([&] { (*procs)->Wake(); });
  auto events = (*procs)->Wait(SteadyTime::max());
  t.join();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ProcEvent::Kind::kWake);
}

}  // namespace
}  // namespace dlrun::launcher

namespace dlrun::launcher {
namespace {

// Calls Wait (which starts spares that are due) until `path` exists; deadline 30 s.
bool WaitForFile(Processes& p, const std::string& path) {
  const SteadyTime deadline = SystemClock().Now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(path)) {
    if (SystemClock().Now() >= deadline) return false;
    p.Wait(SystemClock().Now() + Millis(20));
  }
  return true;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Warm spares (docs/RECOVERY.md): the next Spawn of a local rank promotes its spare, which gets
// the new environment on DLRUN_SPARE_FD; a spare that died meanwhile means a cold start, and
// the agent survives writing to its closed pipe.
TEST(PosixProcesses, ASpareIsPromotedWithTheNewEnvironmentAndADeadOneMeansAColdStart) {
  auto procs = PosixProcesses::Create({});
  ASSERT_TRUE(procs.ok());
  const std::string d = dlrun::testing::MakeTempDir("spare");
  SpawnSpec spec;
  spec.argv = {"sh", "-c", "exit 0"};
  // The spare: says it is up, reads its environment (NUL-separated) to a file, then reports.
  spec.spare_argv = {"bash", "-c",
                     "echo $$ > " + d + "/up.$$.tmp && mv " + d + "/up.$$.tmp " + d +
                         "/up; tr '\\0' '\\n' <&$DLRUN_SPARE_FD > " + d +
                         "/env.$$; [ -s " + d + "/env.$$ ] || exit 0; exit 5"};
  spec.spare_after = Millis(0);
  spec.env = {{"MY_VAR", "first"}};
  auto cold = (*procs)->Spawn(spec);
  ASSERT_TRUE(cold.ok());
  int beats = 0;
  EXPECT_EQ(WaitExit(**procs, *cold, &beats).exit_code, 0);
  ASSERT_TRUE(WaitForFile(**procs, d + "/up"));
  const int spare = std::stoi(Slurp(d + "/up"));
  std::filesystem::remove(d + "/up");

  spec.env = {{"MY_VAR", "second"}};
  auto promoted = (*procs)->Spawn(spec);
  ASSERT_TRUE(promoted.ok());
  EXPECT_EQ(*promoted, spare);
  EXPECT_EQ(WaitExit(**procs, *promoted, &beats).exit_code, 5);
  const std::string env = Slurp(d + "/env." + std::to_string(spare));
  EXPECT_NE(env.find("\nMY_VAR=second\n"), std::string::npos) << env;
  EXPECT_NE(env.find("DLRUN_HEARTBEAT_FD="), std::string::npos) << env;
  EXPECT_EQ(env.find("DLRUN_SPARE_FD="), std::string::npos) << env;

  // The next spare dies before it is needed: the Spawn after it starts the worker cold.
  ASSERT_TRUE(WaitForFile(**procs, d + "/up"));
  const int doomed = std::stoi(Slurp(d + "/up"));
  ASSERT_EQ(kill(doomed, SIGKILL), 0);
  siginfo_t info{};  // until it is a zombie (WNOWAIT: still there for the agent to reap)
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(doomed), &info, WEXITED | WNOWAIT), 0);
  spec.env = {{"MY_VAR", "third"}};
  // No further spare within the test: one started now would write into `d` while it is removed.
  spec.spare_after = std::chrono::hours(1);
  auto again = (*procs)->Spawn(spec);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, doomed);
  EXPECT_EQ(WaitExit(**procs, *again, &beats).exit_code, 0);  // the cold command, not a spare
  (*procs)->CloseOutputs();
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace dlrun::launcher

namespace dlrun::launcher {
namespace {

// The fork server's imports can outlast the rendezvous' patience for a silent node (5 s): the
// wait for them calls the agent's heartbeat meanwhile, and ends at "ready". Here a stand-in
// server (sh) says "ready" after 1.2 s of "imports".
TEST(ForkServerWait, TheAgentsHeartbeatGoesOnWhileItImportsAndTheWaitEndsAtReady) {
  std::unique_ptr<ForkServer> server = ForkServer::Start(
      {"/bin/sh", "-c", "sleep 1.2; printf ready >&\"$DLRUN_FORK_SERVER_FD\"; exec sleep 60"},
      {"PATH=/usr/bin:/bin"});
  ASSERT_NE(server, nullptr);
  int beats = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(server->AwaitReady(
      start + std::chrono::seconds(60), -1, [&] { ++beats; }, Millis(100)));
  EXPECT_TRUE(server->ready());
  // A beat per 100 ms of the wait (about 12), none after it.
  const auto waited = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
  EXPECT_GE(beats, 5) << "waited " << waited.count() << " ms";
  EXPECT_LE(beats, waited.count() / 100 + 1);
}

TEST(ForkServerWait, WithoutABeatTheWaitIsOneAndAServerThatExitsIsGone) {
  std::unique_ptr<ForkServer> server =
      ForkServer::Start({"/bin/sh", "-c", "exit 3"}, {"PATH=/usr/bin:/bin"});
  ASSERT_NE(server, nullptr);
  EXPECT_FALSE(server->AwaitReady(std::chrono::steady_clock::now() + std::chrono::seconds(60), -1));
  EXPECT_TRUE(server->gone());
}

}  // namespace
}  // namespace dlrun::launcher
