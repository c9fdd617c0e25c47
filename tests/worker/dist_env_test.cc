#include "dlrun/dist_env.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include <stdexcept>

#include "absl/status/statusor.h"
#include "common/defaults.h"
#include "gtest/gtest.h"

namespace dlrun::worker {
namespace {

// parse_dist_env throws std::invalid_argument; as a StatusOr here to compare messages.
absl::StatusOr<DistEnv> Parse(std::map<std::string, std::string> vars) {
  try {
    return parse_dist_env([vars](std::string_view n) -> std::optional<std::string> {
      auto it = vars.find(std::string(n));
      if (it == vars.end()) return std::nullopt;
      return it->second;
    });
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

// The installed header cannot include common/defaults.h: its spelling of the port must agree.
TEST(DistEnv, TheInstalledHeadersMasterPortIsTheSharedDefault) {
  EXPECT_EQ(dlrun::worker::DistEnv{}.master_port, dlrun::defaults::kMasterPort);
}

TEST(DistEnv, NoLauncherMeansSingleProcess) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->source, "single");
  EXPECT_EQ(d->world_size, 1);
  EXPECT_EQ(d->rank, 0);
}

TEST(DistEnv, Torchrun) {
  auto d = Parse({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                  {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node1"},
                  {"MASTER_PORT", "1234"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
                  {"TORCHELASTIC_RUN_ID", "j"}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->source, "torchrun");
  EXPECT_EQ(d->rank, 5);
  EXPECT_EQ(d->world_size, 8);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->local_world_size, 4);
  EXPECT_EQ(d->group_rank, 1);
  EXPECT_EQ(d->master_addr, "node1");
  EXPECT_EQ(d->master_port, 1234);
  EXPECT_EQ(d->restart_count, 2);
  EXPECT_EQ(d->run_id, "j");
}

TEST(DistEnv, OpenMpiAndSlurm) {
  auto d = Parse({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"OMPI_COMM_WORLD_NODE_RANK", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "9"}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->source, "openmpi");
  EXPECT_EQ(d->rank, 3);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->group_rank, 1);
  d = Parse({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
             {"SLURM_NODEID", "0"}, {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_NUM_NODES", "1"}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->source, "slurm");
  EXPECT_EQ(d->rank, 1);
  EXPECT_EQ(d->run_id, "77");
}

TEST(DistEnv, ErrorsNameTheVariableAndValue) {
  auto d = Parse({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                  {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(std::string(d.status().message()), "RANK=2 is not below WORLD_SIZE=2");
  d = Parse({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(std::string(d.status().message()).find("RANK='x'"), std::string::npos);
  d = Parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "1"}});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(std::string(d.status().message()).find("MASTER_ADDR"), std::string::npos);
  d = Parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"},
             {"MASTER_PORT", "99999"}});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(std::string(d.status().message()).find("MASTER_PORT='99999'"), std::string::npos);
  d = Parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "5"}});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(std::string(d.status().message()).find("LOCAL_RANK is not set"), std::string::npos);
}

}  // namespace
}  // namespace dlrun::worker

// SIGPIPE (issue: a C++ survivor died of it writing to a peer being replaced). Each case runs in
// a child process, whose end says what the signal did: exit 0 when the write failed with EPIPE and
// the process lived on, or the signal that ended it.
namespace {
int EndOfChild(void (*body)()) {
  pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

// A peer process holds the other end of a socket pair and is SIGKILLed; the survivor writes to it.
void WriteToAKilledPeer() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) _exit(10);
  pid_t peer = fork();
  if (peer == 0) {
    close(sv[0]);
    pause();
    _exit(0);
  }
  close(sv[1]);
  kill(peer, SIGKILL);
  waitpid(peer, nullptr, 0);
  char byte = 0;
  if (write(sv[0], &byte, 1) != -1 || errno != EPIPE) _exit(11);
}

void OnPipe(int) {}
}  // namespace

TEST(WorkerSigpipe, ASurvivorWritingToAKilledPeerGetsEpipeAndLivesOn) {
  EXPECT_EQ(EndOfChild([] {
              signal(SIGPIPE, SIG_DFL);  // as dlrun starts a C++ worker
              if (!dlrun::worker::ignore_sigpipe_unless_handled()) _exit(12);
              WriteToAKilledPeer();
            }),
            0);
  // Without it, the same write ends the process: the case the library's init() now prevents.
  EXPECT_EQ(EndOfChild([] {
              signal(SIGPIPE, SIG_DFL);
              WriteToAKilledPeer();
            }),
            -SIGPIPE);
}

TEST(WorkerSigpipe, AHandlerTheProgramInstalledIsKept) {
  EXPECT_EQ(EndOfChild([] {
              signal(SIGPIPE, OnPipe);
              if (dlrun::worker::ignore_sigpipe_unless_handled()) _exit(13);
              struct sigaction now {};
              sigaction(SIGPIPE, nullptr, &now);
              if (now.sa_handler != OnPipe) _exit(14);
              WriteToAKilledPeer();
            }),
            0);
}
