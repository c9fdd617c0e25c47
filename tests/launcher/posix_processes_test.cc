// The POSIX side of the agent on its own: real fork/exec, pipes, the heartbeat pipe, signalfd.
#include "launcher/agent/posix_processes.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"

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
  char dir[] = "/tmp/dlrun-posix-XXXXXX";
  const std::string d = mkdtemp(dir);
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
