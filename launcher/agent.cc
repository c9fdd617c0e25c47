#include "launcher/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace {

class StaticSource final : public MembershipSource {
 public:
  StaticSource(NodeAssignment base, int max_restarts, std::function<int()> pick)
      : base_(std::move(base)), max_restarts_(max_restarts), pick_(std::move(pick)) {}
  absl::StatusOr<NodeAssignment> Next() override {
    NodeAssignment a = base_;
    a.restart_count = restarts_;
    a.max_restarts = max_restarts_;
    if (pick_) a.master_port = pick_();
    return a;
  }
  bool OnFailure(const std::string&) override { return restarts_++ < max_restarts_; }
  Verdict Check(std::string*) override { return Verdict::kContinue; }
  std::chrono::milliseconds check_interval() const override { return {}; }
  void OnSuccess() override {}

 private:
  NodeAssignment base_;
  int max_restarts_;
  std::function<int()> pick_;
  int restarts_ = 0;
};

}  // namespace

std::unique_ptr<MembershipSource> MakeStaticSource(NodeAssignment base, int max_restarts,
                                                   std::function<int()> pick_master_port) {
  return std::make_unique<StaticSource>(std::move(base), max_restarts,
                                        std::move(pick_master_port));
}

Agent::Agent(AgentOptions options, std::unique_ptr<MembershipSource> source)
    : options_(std::move(options)), source_(std::move(source)) {}

std::string Agent::ErrorFile(int local_rank) const {
  return absl::StrCat(options_.run_dir, "/attempt_", attempt_, "/", local_rank, "/error.json");
}

bool Agent::SpawnGroup(const NodeAssignment& a) {

  std::vector<char*> argv;
  for (const std::string& s : options_.argv) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);

  sigset_t empty;
  sigemptyset(&empty);
  const pid_t agent_pid = getpid();
  workers_.clear();
  for (int lr = 0; lr < options_.nproc; ++lr) {
    const std::string err = ErrorFile(lr);
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
  std::string table = absl::StrCat("restart ", a.restart_count, ": node ", a.node_rank, " of ",
                                   a.num_nodes, ", world size ", a.world_size, ", master ",
                                   a.master_addr, ":", a.master_port, "\n  local_rank  rank  pid");
  for (const Worker& w : workers_) {
    absl::StrAppend(&table, "\n  ", absl::StrFormat("%-10d  %-4d  %d", w.local_rank,
                                                    a.rank_offset + w.local_rank, w.pid));
  }
  spdlog::info("{}", table);
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
      e.global_rank = current_.rank_offset + w.local_rank;
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

int Agent::WaitEvent(std::chrono::steady_clock::time_point deadline, int extra_fd) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int timeout = deadline == std::chrono::steady_clock::time_point::max()
                      ? -1
                      : static_cast<int>(std::max<int64_t>(0, left.count()));
    pollfd p[2] = {{signal_fd_, POLLIN, 0}, {extra_fd, POLLIN, 0}};
    int r = poll(p, extra_fd >= 0 ? 2 : 1, timeout);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;  // deadline
    if ((p[0].revents & POLLIN) == 0) return 0;  // only extra_fd is ready
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

void Agent::PrintFailureSummary(const WorkerExit& first) const {
  std::string cause;
  if (std::string msg = ReadErrorMessage(ErrorFile(first.local_rank));
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

absl::StatusOr<NodeAssignment> Agent::NextAssignment(int* signal) {
  *signal = 0;
  if (source_->check_interval().count() == 0) return source_->Next();  // never blocks
  struct Shared {
    absl::StatusOr<NodeAssignment> result = absl::UnknownError("pending");
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  };
  auto shared = std::make_shared<Shared>();
  MembershipSource* src = source_.get();
  std::thread([shared, src] {
    shared->result = src->Next();
    uint64_t one = 1;
    (void)!write(shared->fd, &one, sizeof one);
  }).detach();
  for (;;) {
    *signal = WaitEvent(std::chrono::steady_clock::time_point::max(), shared->fd);
    if (*signal != 0) return absl::CancelledError("interrupted by a signal");
    uint64_t v = 0;
    if (read(shared->fd, &v, sizeof v) == sizeof v) {
      close(shared->fd);
      return shared->result;
    }
  }
}

void BlockAgentSignals(const std::vector<int>& forwarded) {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int s : forwarded) sigaddset(&mask, s);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
}

int Agent::Run() {
  BlockAgentSignals(options_.forwarded_signals);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int s : options_.forwarded_signals) sigaddset(&mask, s);
  signal_fd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) {
    spdlog::error("signalfd: {}", std::strerror(errno));
    return 1;
  }

  for (;; ++attempt_) {
    exits_.clear();
    int sig = 0;
    absl::StatusOr<NodeAssignment> next = NextAssignment(&sig);
    if (sig != 0) {
      spdlog::warn("received SIG{} while joining the rendezvous: exiting", sigabbrev_np(sig));
      fflush(nullptr);
      _exit(128 + sig);  // a join may still be in flight on its thread: skip destructors
    }
    if (!next.ok()) {
      spdlog::error("{}", std::string(next.status().message()));
      return 1;
    }
    current_ = *next;
    if (!SpawnGroup(current_)) {
      StopGroup(SIGKILL);
      return 1;
    }
    int forwarded = 0;
    const WorkerExit* failure = nullptr;
    MembershipSource::Verdict verdict = MembershipSource::Verdict::kContinue;
    std::string reason;
    const auto interval = source_->check_interval();
    auto next_check = interval.count() > 0 ? std::chrono::steady_clock::now() + interval
                                           : std::chrono::steady_clock::time_point::max();
    while (AliveCount() > 0 && forwarded == 0) {
      forwarded = WaitEvent(next_check);
      for (const WorkerExit& e : exits_) {
        if (e.failed()) {
          failure = &e;
          break;
        }
      }
      if (failure != nullptr) break;
      if (std::chrono::steady_clock::now() >= next_check) {
        verdict = source_->Check(&reason);
        if (verdict != MembershipSource::Verdict::kContinue) break;
        next_check = std::chrono::steady_clock::now() + interval;
      }
    }
    if (forwarded != 0) {
      spdlog::warn("received SIG{}: forwarding to workers and stopping", sigabbrev_np(forwarded));
      StopGroup(forwarded);
      source_->OnFailure(absl::StrCat("agent received SIG", sigabbrev_np(forwarded)));
      return 128 + forwarded;
    }
    if (failure == nullptr && verdict == MembershipSource::Verdict::kRestart) {
      spdlog::warn("the rendezvous opened a new round ({}): restarting workers", reason);
      StopGroup(SIGTERM);
      continue;
    }
    if (failure == nullptr && (verdict == MembershipSource::Verdict::kStop ||
                               verdict == MembershipSource::Verdict::kFinished)) {
      spdlog::error("the rendezvous stopped the job: {}", reason);
      StopGroup(SIGTERM);
      return 1;
    }
    if (failure == nullptr) {
      spdlog::info("all {} worker(s) finished successfully", options_.nproc);
      source_->OnSuccess();
      if (interval.count() == 0) return 0;
      // Wait for the other nodes: a failure elsewhere restarts this node's workers too.
      for (;;) {
        const int sig = WaitEvent(std::chrono::steady_clock::now() + interval);
        if (sig != 0) return 128 + sig;
        verdict = source_->Check(&reason);
        if (verdict != MembershipSource::Verdict::kContinue) break;
      }
      if (verdict == MembershipSource::Verdict::kFinished) return 0;
      if (verdict == MembershipSource::Verdict::kStop) {
        spdlog::error("the rendezvous stopped the job: {}", reason);
        return 1;
      }
      spdlog::warn("the rendezvous opened a new round ({}): running again", reason);
      continue;
    }
    const WorkerExit first = *failure;
    StopGroup(SIGTERM);
    PrintFailureSummary(first);
    const std::string what = first.signal != 0
                                 ? absl::StrCat("rank ", first.global_rank, " got SIG",
                                                sigabbrev_np(first.signal))
                                 : absl::StrCat("rank ", first.global_rank, " exited with ",
                                                first.exit_code);
    if (!source_->OnFailure(what)) {
      return first.signal != 0 ? 128 + first.signal : first.exit_code;
    }
    spdlog::warn("restarting worker group (restart {} of {})", current_.restart_count + 1,
                 current_.max_restarts);
  }
}

}  // namespace dlrun::launcher
