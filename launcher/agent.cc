#include "launcher/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

extern char** environ;

namespace dlrun::launcher {
namespace {

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::vector<std::string> MergedEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string_view::npos && overrides.count(std::string(kv.substr(0, eq)))) continue;
    out.emplace_back(kv);
  }
  for (const auto& [k, v] : overrides) out.push_back(k + "=" + v);
  return out;
}

// Reads the "message" of a torchelastic error file, or "" if there is none.
std::string ReadErrorMessage(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "(unreadable error file " + path + ")";
  const nlohmann::json* m = &j;
  if (m->contains("message")) m = &(*m)["message"];
  if (m->is_object() && m->contains("message")) m = &(*m)["message"];
  return m->is_string() ? m->get<std::string>() : m->dump();
}

}  // namespace

Agent::Agent(AgentOptions options) : options_(std::move(options)) {}

std::string Agent::ErrorFile(int restart_count, int local_rank) const {
  return absl::StrCat(options_.run_dir, "/attempt_", restart_count, "/", local_rank,
                      "/error.json");
}

bool Agent::SpawnGroup(int restart_count) {
  NodeAssignment a = options_.assignment;
  a.restart_count = restart_count;
  a.max_restarts = options_.max_restarts;
  if (options_.pick_master_port) a.master_port = options_.pick_master_port();

  std::vector<char*> argv;
  for (const std::string& s : options_.argv) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);

  sigset_t empty;
  sigemptyset(&empty);
  const pid_t agent_pid = getpid();
  workers_.clear();
  for (int lr = 0; lr < options_.nproc; ++lr) {
    const std::string err = ErrorFile(restart_count, lr);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(err).parent_path(), ec);
    std::vector<std::string> env =
        MergedEnvironment(BuildWorkerEnv(a, lr, err, options_.omp_threads));
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);

    pid_t pid = fork();
    if (pid < 0) {
      spdlog::error("fork failed for local rank {}: {}", lr, std::strerror(errno));
      return false;
    }
    if (pid == 0) {
      // Child: own process group (so the agent can signal everything it starts), die with the
      // agent even on SIGKILL, and unblock the signals the agent keeps for its signalfd.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != agent_pid) _exit(128 + SIGKILL);
      sigprocmask(SIG_SETMASK, &empty, nullptr);
      execvpe(argv[0], argv.data(), envp.data());
      const std::string msg = absl::StrCat("dlrun: cannot execute '", options_.argv[0],
                                           "': ", std::strerror(errno), "\n");
      (void)!write(STDERR_FILENO, msg.data(), msg.size());
      _exit(127);
    }
    setpgid(pid, pid);  // also in the parent, so signalling the group cannot race the child
    workers_.push_back({lr, pid, true});
  }
  spdlog::info("attempt {}: started {} worker(s) as ranks {}..{} of {} (master {}:{})",
               restart_count, options_.nproc, a.rank_offset, a.rank_offset + options_.nproc - 1,
               a.world_size, a.master_addr, a.master_port);
  return true;
}

void Agent::ReapAll() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (Worker& w : workers_) {
      if (w.pid != pid || !w.alive) continue;
      w.alive = false;
      WorkerExit e;
      e.local_rank = w.local_rank;
      e.global_rank = options_.assignment.rank_offset + w.local_rank;
      e.pid = pid;
      e.when_s = WallSeconds();
      if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
      } else {
        e.exit_code = WEXITSTATUS(status);
      }
      exits_.push_back(e);
    }
  }
}

int Agent::AliveCount() const {
  int n = 0;
  for (const Worker& w : workers_) n += w.alive ? 1 : 0;
  return n;
}

int Agent::WaitEvent(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int timeout = deadline == std::chrono::steady_clock::time_point::max()
                      ? -1
                      : static_cast<int>(std::max<int64_t>(0, left.count()));
    pollfd p{signal_fd_, POLLIN, 0};
    int r = poll(&p, 1, timeout);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;  // deadline
    signalfd_siginfo si;
    int forwarded = 0;
    while (read(signal_fd_, &si, sizeof si) == sizeof si) {
      if (si.ssi_signo == SIGCHLD) {
        ReapAll();
      } else {
        forwarded = static_cast<int>(si.ssi_signo);
      }
    }
    ReapAll();
    return forwarded;
  }
}

void Agent::StopGroup(int first_signal) {
  for (const Worker& w : workers_) {
    if (w.alive) kill(-w.pid, first_signal);
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.grace;
  while (AliveCount() > 0 && std::chrono::steady_clock::now() < deadline) WaitEvent(deadline);
  for (const Worker& w : workers_) {
    if (w.alive) {
      spdlog::warn("local rank {} (pid {}) did not stop within {} ms: SIGKILL", w.local_rank,
                   w.pid, options_.grace.count());
    }
    kill(-w.pid, SIGKILL);  // the leader's exit does not end its children: kill the whole group
  }
  while (AliveCount() > 0) WaitEvent(std::chrono::steady_clock::time_point::max());
}

void Agent::PrintFailureSummary(const WorkerExit& first, int restart_count) const {
  std::string cause;
  if (std::string msg = ReadErrorMessage(ErrorFile(restart_count, first.local_rank));
      !msg.empty()) {
    cause = msg;
  } else if (first.signal != 0) {
    cause = absl::StrCat("Signal ", first.signal, " (SIG", sigabbrev_np(first.signal),
                         ") received by PID ", first.pid);
  } else {
    cause = absl::StrCat("exit code ", first.exit_code);
  }
  spdlog::error("job failed. Root cause (first failure): rank {} (local rank {}, pid {}): {}",
                first.global_rank, first.local_rank, first.pid, cause);
}

int Agent::Run() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int s : options_.forwarded_signals) sigaddset(&mask, s);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal_fd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) {
    spdlog::error("signalfd: {}", std::strerror(errno));
    return 1;
  }

  for (int attempt = 0;; ++attempt) {
    exits_.clear();
    if (!SpawnGroup(attempt)) {
      StopGroup(SIGKILL);
      return 1;
    }
    int forwarded = 0;
    const WorkerExit* failure = nullptr;
    while (AliveCount() > 0 && forwarded == 0) {
      forwarded = WaitEvent(std::chrono::steady_clock::time_point::max());
      for (const WorkerExit& e : exits_) {
        if (e.failed()) {
          failure = &e;
          break;
        }
      }
      if (failure != nullptr) break;
    }
    if (forwarded != 0) {
      spdlog::warn("received SIG{}: forwarding to workers and stopping", sigabbrev_np(forwarded));
      StopGroup(forwarded);
      return 128 + forwarded;
    }
    if (failure == nullptr) {
      spdlog::info("all {} worker(s) finished successfully", options_.nproc);
      return 0;
    }
    const WorkerExit first = *failure;
    StopGroup(SIGTERM);
    PrintFailureSummary(first, attempt);
    if (attempt >= options_.max_restarts) {
      return first.signal != 0 ? 128 + first.signal : first.exit_code;
    }
    spdlog::warn("restarting worker group ({} of {} restarts)", attempt + 1,
                 options_.max_restarts);
  }
}

}  // namespace dlrun::launcher
