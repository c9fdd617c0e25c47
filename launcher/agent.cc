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

#include <sched.h>

#include <algorithm>
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

struct ErrorRecord {
  std::string message;  // empty: no (readable) file
  double timestamp = 0;
};

// Reads a torchelastic error file:
// {"message": {"message": "...", "extraInfo": {"timestamp": "<epoch s>", ...}}}.
ErrorRecord ReadErrorRecord(const std::string& path) {
  ErrorRecord r;
  std::ifstream in(path);
  if (!in) return r;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    r.message = "(unreadable error file " + path + ")";
    return r;
  }
  const nlohmann::json* m = &j;
  if (m->contains("message")) m = &(*m)["message"];
  if (m->is_object()) {
    if (m->contains("extraInfo") && (*m)["extraInfo"].is_object()) {
      const auto& ts = (*m)["extraInfo"].value("timestamp", nlohmann::json());
      if (ts.is_string()) r.timestamp = std::atof(ts.get<std::string>().c_str());
      if (ts.is_number()) r.timestamp = ts.get<double>();
    }
    if (m->contains("message")) m = &(*m)["message"];
  }
  r.message = m->is_string() ? m->get<std::string>() : m->dump();
  return r;
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
  workers_.resize(options_.nproc);
  const int ncpu = static_cast<int>(options_.cpus.size());
  for (int lr = 0; lr < options_.nproc; ++lr) {
    Worker& w = workers_[lr];
    w.local_rank = lr;
    const std::string err = ErrorFile(lr);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(err).parent_path(), ec);
    std::filesystem::remove(err, ec);  // a stale file must not be taken for this attempt's

    std::map<std::string, std::string> overrides =
        BuildWorkerEnv(a, lr, err, options_.omp_threads);
    int out_pipe[2], err_pipe[2], hb_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
        pipe2(hb_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      spdlog::error("pipe failed for local rank {}: {}", lr, std::strerror(errno));
      return false;
    }
    overrides["DLRUN_HEARTBEAT_FD"] = std::to_string(hb_pipe[1]);
    if (lr < static_cast<int>(options_.gpus.size())) {
      overrides["CUDA_VISIBLE_DEVICES"] = options_.gpus[lr];
    }
    std::vector<std::string> env = MergedEnvironment(overrides);
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    // This worker's share of the CPUs: a contiguous block, when there is at least one each.
    cpu_set_t cpuset;
    CPU_ZERO(&cpuset);
    const bool pin = ncpu >= options_.nproc && ncpu > 0;
    if (pin) {
      const int per = ncpu / options_.nproc;
      for (int c = lr * per; c < (lr + 1) * per; ++c) CPU_SET(options_.cpus[c], &cpuset);
    }

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
      dup2(out_pipe[1], STDOUT_FILENO);
      dup2(err_pipe[1], STDERR_FILENO);
      fcntl(hb_pipe[1], F_SETFD, 0);  // the heartbeat pipe survives exec
      int fl = fcntl(hb_pipe[1], F_GETFL);
      fcntl(hb_pipe[1], F_SETFL, fl | O_NONBLOCK);  // a full pipe never blocks a worker
      if (pin) sched_setaffinity(0, sizeof cpuset, &cpuset);
      execvpe(argv[0], argv.data(), envp.data());
      const std::string msg = absl::StrCat("dlrun: cannot execute '", options_.argv[0],
                                           "': ", std::strerror(errno), "\n");
      (void)!write(STDERR_FILENO, msg.data(), msg.size());
      _exit(127);
    }
    setpgid(pid, pid);  // also in the parent, so signalling the group cannot race the child
    close(out_pipe[1]);
    close(err_pipe[1]);
    close(hb_pipe[1]);
    w.pid = pid;
    w.alive = true;
    w.out.fd = out_pipe[0];
    w.err.fd = err_pipe[0];
    w.heartbeat_fd = hb_pipe[0];
    const int mode = lr < static_cast<int>(options_.redirects.size()) ? options_.redirects[lr] : 0;
    const bool shown = options_.console_ranks.empty() ||
                       std::find(options_.console_ranks.begin(), options_.console_ranks.end(),
                                 lr) != options_.console_ranks.end();
    w.out.console_fd = shown && !(mode & 1) ? STDOUT_FILENO : -1;
    w.err.console_fd = shown && !(mode & 2) ? STDERR_FILENO : -1;
    if (!options_.log_dir.empty()) {
      const std::string dir = absl::StrCat(options_.log_dir, "/attempt_", attempt_, "/", lr);
      std::filesystem::create_directories(dir, ec);
      w.out.log = std::fopen((dir + "/stdout.log").c_str(), "w");
      w.err.log = std::fopen((dir + "/stderr.log").c_str(), "w");
      if (w.out.log == nullptr || w.err.log == nullptr) {
        spdlog::warn("cannot write logs in {}: {}", dir, std::strerror(errno));
      }
    }
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

void Agent::DrainStream(Worker& w, Stream& s, bool flush) {
  if (s.fd >= 0) {
    char buf[8192];
    ssize_t n = read(s.fd, buf, sizeof buf);
    if (n > 0) {
      if (s.log != nullptr) std::fwrite(buf, 1, static_cast<size_t>(n), s.log);
      s.partial.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      close(s.fd);
      s.fd = -1;
      flush = true;
    }
  }
  if (s.console_fd < 0) {
    s.partial.clear();
    return;
  }
  const std::string prefix = absl::StrCat("[rank ", current_.rank_offset + w.local_rank, "]: ");
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    absl::StrAppend(&out, prefix, absl::string_view(s.partial).substr(start, nl + 1 - start));
  }
  s.partial.erase(0, start);
  if (flush && !s.partial.empty()) {
    absl::StrAppend(&out, prefix, s.partial, "\n");
    s.partial.clear();
  }
  if (!out.empty()) {
    if (s.console_fd == STDERR_FILENO) std::fflush(stdout);
    (void)!write(s.console_fd, out.data(), out.size());
  }
}

void Agent::CloseStreams() {
  // Workers are dead; their pipes end once any children they left are gone too. A child that
  // outlives its worker (kept in another process group) must not hold dlrun up: bounded wait.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  for (;;) {
    std::vector<pollfd> fds;
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0});
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (fds.empty() || left <= 0 || poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) {
      break;
    }
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) DrainStream(w, *s, false);
      }
    }
  }
  for (Worker& w : workers_) {
    for (Stream* s : {&w.out, &w.err}) {
      if (s->fd >= 0) close(s->fd);
      s->fd = -1;
      DrainStream(w, *s, true);
      if (s->log != nullptr) std::fclose(s->log);
      s->log = nullptr;
    }
    if (w.heartbeat_fd >= 0) close(w.heartbeat_fd);
    w.heartbeat_fd = -1;
  }
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
      e.stopped = stopping_;
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

const Agent::Worker* Agent::FindHung(std::chrono::steady_clock::time_point* next) const {
  *next = std::chrono::steady_clock::time_point::max();
  if (options_.hang_timeout.count() == 0) return nullptr;
  const auto now = std::chrono::steady_clock::now();
  for (const Worker& w : workers_) {
    if (!w.alive || !w.heartbeat_seen) continue;
    const auto due = w.last_heartbeat + options_.hang_timeout;
    if (due <= now) return &w;
    *next = std::min(*next, due);
  }
  return nullptr;
}

int Agent::WaitEvent(std::chrono::steady_clock::time_point deadline, int extra_fd) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int timeout = deadline == std::chrono::steady_clock::time_point::max()
                      ? -1
                      : static_cast<int>(std::max<int64_t>(0, left.count()));
    // [0] signals, [1] extra, then per worker: stdout, stderr, heartbeat.
    std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}, {extra_fd, POLLIN, 0}};
    for (const Worker& w : workers_) {
      fds.push_back({w.out.fd, POLLIN, 0});
      fds.push_back({w.err.fd, POLLIN, 0});
      fds.push_back({w.heartbeat_fd, POLLIN, 0});
    }
    int r = poll(fds.data(), fds.size(), timeout);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;  // deadline
    bool first_heartbeat = false;
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (fds[2 + 3 * i].revents) DrainStream(w, w.out, false);
      if (fds[3 + 3 * i].revents) DrainStream(w, w.err, false);
      if (fds[4 + 3 * i].revents) {
        char buf[256];
        ssize_t n = read(w.heartbeat_fd, buf, sizeof buf);
        if (n > 0) {
          first_heartbeat |= !w.heartbeat_seen;
          w.heartbeat_seen = true;
          w.last_heartbeat = std::chrono::steady_clock::now();
        } else if (n == 0) {
          close(w.heartbeat_fd);
          w.heartbeat_fd = -1;
        }
      }
    }
    int forwarded = 0;
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(signal_fd_, &si, sizeof si) == sizeof si) {
        const int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGCHLD) {
          ReapAll();
        } else if (std::find(options_.passthrough_signals.begin(),
                             options_.passthrough_signals.end(),
                             sig) != options_.passthrough_signals.end()) {
          spdlog::info("forwarding SIG{} to the workers", sigabbrev_np(sig));
          for (const Worker& w : workers_) {
            if (w.alive) kill(-w.pid, sig);
          }
        } else {
          forwarded = sig;
        }
      }
      ReapAll();
    }
    if (forwarded != 0 || (fds[1].revents & POLLIN)) return forwarded;
    if (fds[0].revents & POLLIN) return 0;  // a worker exited
    if (first_heartbeat) return 0;           // the caller starts that worker's hang clock
    // Only output or heartbeats arrived: keep waiting unless the deadline passed.
    if (std::chrono::steady_clock::now() >= deadline) return 0;
  }
}

void Agent::StopGroup(int first_signal) {
  stopping_ = true;
  for (const Worker& w : workers_) {
    if (w.alive) kill(-w.pid, first_signal);
  }
  // Stopping can take the whole grace period (a worker that ignores SIGTERM, or is stopped):
  // keep heartbeating meanwhile, or the rendezvous declares this live node dead. The verdict
  // does not matter here: the group is being stopped anyway.
  const auto interval = source_->check_interval();
  auto next_check = interval.count() > 0 ? std::chrono::steady_clock::now() + interval
                                         : std::chrono::steady_clock::time_point::max();
  auto wait_until = [&](std::chrono::steady_clock::time_point deadline) {
    while (AliveCount() > 0 && std::chrono::steady_clock::now() < deadline) {
      WaitEvent(std::min(deadline, next_check));
      if (std::chrono::steady_clock::now() >= next_check) {
        std::string ignored;
        source_->Check(&ignored);
        next_check = std::chrono::steady_clock::now() + interval;
      }
    }
  };
  wait_until(std::chrono::steady_clock::now() + options_.grace);
  for (const Worker& w : workers_) {
    if (w.alive) {
      spdlog::warn("local rank {} (pid {}) did not stop within {} ms: SIGKILL", w.local_rank,
                   w.pid, options_.grace.count());
    }
    kill(-w.pid, SIGKILL);  // the leader's exit does not end its children: kill the whole group
  }
  wait_until(std::chrono::steady_clock::time_point::max());
  CloseStreams();
  stopping_ = false;
}

WorkerExit Agent::PrintFailureSummary() const {
  // torchrun's rule: the failure with the earliest error-file timestamp is the root cause;
  // without error files, the first worker to exit.
  const WorkerExit* root = nullptr;
  double root_ts = 0;
  std::string root_msg;
  for (const WorkerExit& e : exits_) {
    if (!e.failed() || e.stopped) continue;
    ErrorRecord rec = ReadErrorRecord(ErrorFile(e.local_rank));
    if (!rec.message.empty() && (root == nullptr || root_msg.empty() || rec.timestamp < root_ts)) {
      root = &e;
      root_ts = rec.timestamp;
      root_msg = rec.message;
    } else if (root == nullptr) {
      root = &e;
    }
  }
  if (root == nullptr) return {};
  std::string cause = root_msg;
  if (cause.empty() && root->signal != 0) {
    cause = absl::StrCat("Signal ", root->signal, " (SIG", sigabbrev_np(root->signal),
                         ") received by PID ", root->pid);
  } else if (cause.empty()) {
    cause = absl::StrCat("exit code ", root->exit_code);
  }
  spdlog::error("job failed. Root cause (first failure): rank {} (local rank {}, pid {}): {}",
                root->global_rank, root->local_rank, root->pid, cause);
  for (const WorkerExit& e : exits_) {
    if (!e.failed() || e.stopped || &e == root) continue;
    spdlog::error("  also failed: rank {} (local rank {}, pid {}): {}", e.global_rank,
                  e.local_rank, e.pid,
                  e.signal != 0 ? absl::StrCat("signal ", e.signal, " (SIG",
                                               sigabbrev_np(e.signal), ")")
                                : absl::StrCat("exit code ", e.exit_code));
  }
  return *root;
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
  std::vector<int> handled = options_.forwarded_signals;
  handled.insert(handled.end(), options_.passthrough_signals.begin(),
                 options_.passthrough_signals.end());
  BlockAgentSignals(handled);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int s : handled) sigaddset(&mask, s);
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
    const Worker* hung = nullptr;
    while (AliveCount() > 0 && forwarded == 0) {
      std::chrono::steady_clock::time_point next_hang;
      hung = FindHung(&next_hang);
      if (hung != nullptr) break;
      forwarded = WaitEvent(std::min(next_check, next_hang));
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
    if (hung != nullptr) {
      const int rank = current_.rank_offset + hung->local_rank;
      const std::string what = absl::StrCat("rank ", rank, " (local rank ", hung->local_rank,
                                            ", pid ", hung->pid, ") hung: no heartbeat for ",
                                            options_.hang_timeout.count(), " ms");
      spdlog::error("{}: stopping the worker group", what);
      StopGroup(SIGTERM);
      if (!source_->OnFailure(what)) return kHangExitCode;
      spdlog::warn("restarting worker group after a hang");
      continue;
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
      CloseStreams();
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
    StopGroup(SIGTERM);
    const WorkerExit first = PrintFailureSummary();
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
