#include "launcher/workers/posix_processes.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "launcher/workers/worker_pipes.h"

namespace dlrun::launcher {
namespace {

sigset_t SignalSet(const std::vector<int>& handled) {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int s : handled) sigaddset(&mask, s);
  return mask;
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

std::unique_ptr<LineStream> OpenStream(const std::string& prefix, const StreamRoute& r) {
  FILE* log = r.log_path.empty() ? nullptr : std::fopen(r.log_path.c_str(), "w");
  return std::make_unique<LineStream>(prefix, r.console_fd, log);
}

}  // namespace

void BlockAgentSignals(const std::vector<int>& handled) {
  sigset_t mask = SignalSet(handled);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
}

absl::StatusOr<std::unique_ptr<PosixProcesses>> PosixProcesses::Create(
    const std::vector<int>& handled) {
  BlockAgentSignals(handled);
  // A write to a pipe whose reader is gone (a spare that died just before its promotion, a
  // console pipe closed by `| head`) must fail with EPIPE, not kill the agent and its job.
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask = SignalSet(handled);
  const int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) return absl::InternalError(absl::StrCat("signalfd: ", std::strerror(errno)));
  const int wfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wfd < 0) {
    close(sfd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<PosixProcesses>(new PosixProcesses(sfd, wfd));
}

PosixProcesses::~PosixProcesses() {
  for (auto& [lr, sp] : spares_) DiscardSpare(&sp);
  CloseOutputs();
  close(signal_fd_);
  close(wake_fd_);
}

absl::StatusOr<PosixProcesses::Started> PosixProcesses::Start(
    const std::vector<std::string>& argv_in, std::map<std::string, std::string> env,
    const std::vector<int>& cpu_list, bool pty, bool spare,
    const std::vector<std::string>& fork_server_argv) {
  WorkerPipes p;
  if (absl::Status st = p.Open(pty, spare); !st.ok()) return st;
  env[contract::kHeartbeatFd] = std::to_string(p.heartbeat[1]);
  env[contract::kControlFd] = std::to_string(p.control[0]);
  if (spare) env[contract::kSpareFd] = std::to_string(p.spare[0]);
  std::vector<std::string> env_strings = MergedEnvironment(env);
  std::vector<char*> envp, argv;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (const std::string& s : argv_in) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : cpu_list) CPU_SET(c, &cpus);
  const std::string failure = absl::StrCat("dlrun: cannot execute '", argv_in[0], "': ");

  pid_t pid = -1;
  if (ForkServerReady(fork_server_argv, env_strings)) {
    auto forked = fork_server_->Fork(ForkServer::WorkerRequest(
        p.out[1], p.err[1], p.heartbeat[1], p.control[0], p.spare[0], env_strings, cpu_list));
    if (forked.ok()) pid = *forked;
  }
  const bool forked = pid >= 0;
  if (pid < 0) {
    const pid_t agent_pid = getpid();
    pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid == 0) {
      ExecChild(agent_pid, p.out[1], p.err[1], p.heartbeat[1], p.control[0], p.spare[0],
                cpu_list.empty() ? nullptr : &cpus, argv.data(), envp.data(), failure);
    }
    setpgid(pid, pid);  // also in the parent, so signalling the group cannot race the child
  }
  close(p.out[1]);
  close(p.err[1]);
  close(p.heartbeat[1]);
  close(p.control[0]);
  // The agent never waits on a worker that does not read: a full pipe drops the word.
  fcntl(p.control[1], F_SETFL, fcntl(p.control[1], F_GETFL) | O_NONBLOCK);
  if (spare) close(p.spare[0]);
  Started st;
  st.pid = pid;
  st.out_fd = p.out[0];
  st.err_fd = p.err[0];
  st.heartbeat_fd = p.heartbeat[0];
  st.heartbeat_child_fd = p.heartbeat[1];
  st.control_fd = p.control[1];
  st.control_child_fd = p.control[0];
  st.spare_fd = p.spare[1];
  st.forked = forked;
  return st;
}

bool PosixProcesses::ForkServerReady(const std::vector<std::string>& argv,
                                     const std::vector<std::string>& env) {
  if (argv.empty()) return false;
  if (!fork_server_tried_) {
    fork_server_tried_ = true;
    fork_server_ = ForkServer::Start(argv, env);
  }
  if (!fork_server_ || fork_server_->argv() != argv) return false;
  // The first workers wait for its imports (they would do the same imports themselves); a
  // signal for the agent ends the wait (those workers then start cold).
  return fork_server_->AwaitReady(SystemClock().Now() + Millis(180000), signal_fd_, beat_,
                                  beat_every_);
}

SteadyTime PosixProcesses::SpareDue(const SpawnSpec& spec) const {
  const bool forked =
      fork_server_ && fork_server_->ready() && fork_server_->argv() == spec.fork_server_argv;
  return SystemClock().Now() + (forked ? Millis(0) : spec.spare_after);
}

void PosixProcesses::DiscardSpare(Spare* s) {
  kill(-s->proc.pid, SIGKILL);
  for (int* fd : {&s->proc.out_fd, &s->proc.err_fd, &s->proc.heartbeat_fd, &s->proc.spare_fd,
                  &s->proc.control_fd}) {
    CloseFd(fd);
  }
}

std::optional<PosixProcesses::Started> PosixProcesses::Promote(const SpawnSpec& spec) {
  auto it = spares_.find(spec.local_rank);
  if (it == spares_.end()) return std::nullopt;
  Spare sp = std::move(it->second);
  spares_.erase(it);
  int status = 0;
  // waitpid: a spare that has exited (even if not reaped yet) cannot be promoted. Reaping it
  // here is fine: the agent never tracks a spare's exit.
  if (sp.argv != spec.spare_argv || sp.cpus != spec.cpus || sp.pty != spec.stdout_pty ||
      waitpid(sp.proc.pid, &status, WNOHANG) != 0) {
    DiscardSpare(&sp);
    return std::nullopt;
  }
  // The worker's whole environment, as a cold start would have it, on the spare's pipe.
  std::map<std::string, std::string> env = spec.env;
  env[contract::kHeartbeatFd] = std::to_string(sp.proc.heartbeat_child_fd);
  env[contract::kControlFd] = std::to_string(sp.proc.control_child_fd);
  std::string block;
  for (const std::string& kv : MergedEnvironment(env)) {
    block += kv;
    block.push_back('\0');
  }
  size_t done = 0;
  const SteadyTime deadline = SystemClock().Now() + Millis(2000);
  fcntl(sp.proc.spare_fd, F_SETFL, fcntl(sp.proc.spare_fd, F_GETFL) | O_NONBLOCK);
  while (done < block.size()) {
    const ssize_t n = write(sp.proc.spare_fd, block.data() + done, block.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const auto left = std::chrono::duration_cast<Millis>(deadline - SystemClock().Now()).count();
    pollfd p{sp.proc.spare_fd, POLLOUT, 0};
    if (n < 0 && errno == EAGAIN && left > 0 && poll(&p, 1, static_cast<int>(left)) > 0) continue;
    DiscardSpare(&sp);  // dead or stuck: start cold
    return std::nullopt;
  }
  CloseFd(&sp.proc.spare_fd);
  return sp.proc;
}

void PosixProcesses::StartDueSpares() {
  const SteadyTime now = SystemClock().Now();
  for (auto it = pending_spares_.begin(); it != pending_spares_.end();) {
    if (it->second.due > now) {
      ++it;
      continue;
    }
    const SpawnSpec& spec = it->second.spec;
    auto st = Start(spec.spare_argv, spec.env, spec.cpus, spec.stdout_pty, /*spare=*/true,
                    spec.fork_server_argv);
    if (st.ok()) {
      Spare sp;
      sp.proc = *st;
      sp.argv = spec.spare_argv;
      sp.cpus = spec.cpus;
      sp.pty = spec.stdout_pty;
      if (auto old = spares_.find(spec.local_rank); old != spares_.end())
        DiscardSpare(&old->second);
      spares_[spec.local_rank] = std::move(sp);
    }
    it = pending_spares_.erase(it);
  }
}

absl::StatusOr<pid_t> PosixProcesses::Spawn(const SpawnSpec& spec) {
  std::optional<Started> st;
  if (!spec.spare_argv.empty()) st = Promote(spec);
  StartKind kind = StartKind::kSpare;
  if (!st) {
    auto cold = Start(spec.argv, spec.env, spec.cpus, spec.stdout_pty, /*spare=*/false,
                      spec.fork_server_argv);
    if (!cold.ok()) return cold.status();
    st = *cold;
    kind = st->forked ? StartKind::kForked : StartKind::kCold;
  }
  started_[st->pid] = kind;
  if (!spec.spare_argv.empty()) pending_spares_[spec.local_rank] = {spec, SpareDue(spec)};
  Child c;
  c.pid = st->pid;
  c.out_fd = st->out_fd;
  c.err_fd = st->err_fd;
  c.heartbeat_fd = st->heartbeat_fd;
  c.control_fd = st->control_fd;
  c.out = OpenStream(spec.console_prefix, spec.out);
  c.err = OpenStream(spec.console_prefix, spec.err);
  children_.push_back(std::move(c));
  return st->pid;
}

void PosixProcesses::SignalGroup(pid_t pid, int sig) { kill(-pid, sig); }

void PosixProcesses::KeepSpare(const SpawnSpec& spec) {
  if (spec.spare_argv.empty() || spares_.count(spec.local_rank) != 0) return;
  pending_spares_[spec.local_rank] = {spec, SpareDue(spec)};
}

bool PosixProcesses::Tell(pid_t pid, const std::string& line) {
  for (const Child& c : children_) {
    if (c.pid != pid || c.control_fd < 0) continue;
    ssize_t n;
    do {
      n = write(c.control_fd, line.data(), line.size());  // < PIPE_BUF: whole or nothing
    } while (n < 0 && errno == EINTR);
    return n == static_cast<ssize_t>(line.size());
  }
  return false;
}

void PosixProcesses::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

void PosixProcesses::Drain(int* fd, LineStream* s) {
  char buf[8192];
  const ssize_t n = read(*fd, buf, sizeof buf);
  if (n > 0) {
    s->Feed(buf, static_cast<size_t>(n));
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    CloseFd(fd);
    s->Finish();  // print an unfinished last line now
  }
}

void PosixProcesses::ReadRecords(Child* c, std::vector<ProcEvent>* events) {
  // All of it (non-blocking): a record written just before the worker died ("D done") comes
  // before the exit that is reaped after this.
  char buf[4096];
  ssize_t n = sizeof buf;
  for (int reads = 0; n == static_cast<ssize_t>(sizeof buf) && c->heartbeat_fd >= 0; ++reads) {
    n = read(c->heartbeat_fd, buf, sizeof buf);
    if (n == 0) CloseFd(&c->heartbeat_fd);
    if (n <= 0) break;
    if (reads == 0) events->push_back({ProcEvent::Kind::kHeartbeat, c->pid, 0, 0, {}});
    std::vector<StepRecord> steps;
    const int64_t bad_before = c->records.bad();
    c->records.Feed(buf, static_cast<size_t>(n), &steps);
    for (const StepRecord& r : steps) events->push_back({ProcEvent::Kind::kStep, c->pid, 0, 0, r});
    for (int64_t b = bad_before; b < c->records.bad(); ++b) {
      events->push_back({ProcEvent::Kind::kBadRecord, c->pid, 0, 0, {}});
    }
  }
}

void PosixProcesses::Reap(std::vector<ProcEvent>* events) {
  for (;;) {
    int status = 0;
    rusage usage{};
    const pid_t pid = wait4(-1, &status, WNOHANG, &usage);
    if (pid <= 0) return;
    if (fork_server_ && pid == fork_server_->pid()) {  // gone: workers start cold from now on
      fork_server_->Exited();
      continue;
    }
    bool spare = false;  // a spare that died (or was discarded) is simply gone
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      if (it->second.proc.pid != pid) continue;
      DiscardSpare(&it->second);
      spares_.erase(it);
      spare = true;
      break;
    }
    if (spare) continue;
    started_.erase(pid);
    ProcEvent e;
    e.kind = ProcEvent::Kind::kExited;
    e.pid = pid;
    e.cpu_s = CpuSeconds(usage);
    e.rss_peak_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // kilobytes on Linux
    if (WIFSIGNALED(status)) {
      e.signal = WTERMSIG(status);
    } else {
      e.exit_code = WEXITSTATUS(status);
    }
    events->push_back(e);
  }
}

void PosixProcesses::ReadSignals(std::vector<ProcEvent>* events) {
  signalfd_siginfo si;
  while (read(signal_fd_, &si, sizeof si) == sizeof si) {
    const int sig = static_cast<int>(si.ssi_signo);
    if (sig != SIGCHLD) events->push_back({ProcEvent::Kind::kSignal, -1, 0, sig, {}});
  }
  Reap(events);  // SIGCHLDs coalesce: always reap everything that has exited
}

std::vector<ProcEvent> PosixProcesses::Wait(SteadyTime deadline) {
  std::vector<ProcEvent> events;
  while (events.empty()) {
    StartDueSpares();
    SteadyTime wake_at = deadline;
    for (const auto& [lr, p] : pending_spares_) wake_at = std::min(wake_at, p.due);
    int timeout = -1;
    if (wake_at != SteadyTime::max()) {
      const auto left = std::chrono::duration_cast<Millis>(wake_at - SystemClock().Now());
      timeout = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    // [0] signals, [1] wake-ups, then per child: stdout, stderr, heartbeat.
    std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    for (const Child& c : children_) {
      fds.push_back({c.out_fd, POLLIN, 0});
      fds.push_back({c.err_fd, POLLIN, 0});
      fds.push_back({c.heartbeat_fd, POLLIN, 0});
    }
    const int r = poll(fds.data(), fds.size(), timeout);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && SystemClock().Now() < deadline) continue;  // a spare is due
    if (r <= 0) return events;                               // the deadline passed
    for (size_t i = 0; i < children_.size(); ++i) {
      Child& c = children_[i];
      if (fds[2 + 3 * i].revents) Drain(&c.out_fd, c.out.get());
      if (fds[3 + 3 * i].revents) Drain(&c.err_fd, c.err.get());
      if (fds[4 + 3 * i].revents) ReadRecords(&c, &events);
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v = 0;
      (void)!read(wake_fd_, &v, sizeof v);
      events.push_back({ProcEvent::Kind::kWake, -1, 0, 0, {}});
    }
    if (fds[0].revents & POLLIN) ReadSignals(&events);
    if (events.empty() && SystemClock().Now() >= deadline) return events;
  }
  return events;
}

void PosixProcesses::CloseOutputs() {
  // The workers are dead; their pipes end once any children they left are gone too. A child
  // that outlives its worker (in another process group) must not hold dlrun up: bounded wait.
  const SteadyTime deadline = SystemClock().Now() + Millis(500);
  for (;;) {
    std::vector<pollfd> fds;
    for (const Child& c : children_) {
      for (int fd : {c.out_fd, c.err_fd}) {
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
      }
    }
    const auto left = std::chrono::duration_cast<Millis>(deadline - SystemClock().Now()).count();
    if (fds.empty() || left <= 0 || poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) {
      break;
    }
    for (Child& c : children_) {
      if (c.out_fd >= 0) Drain(&c.out_fd, c.out.get());
      if (c.err_fd >= 0) Drain(&c.err_fd, c.err.get());
    }
  }
  error_tails_.clear();
  for (Child& c : children_) {
    CloseFd(&c.out_fd);
    CloseFd(&c.err_fd);
    CloseFd(&c.heartbeat_fd);
    CloseFd(&c.control_fd);
    c.out->Finish();
    c.err->Finish();
    error_tails_[c.pid] = c.err->tail();
  }
  children_.clear();
}

std::string PosixProcesses::ErrorTail(pid_t pid) const {
  for (const Child& c : children_) {  // a worker of the running group (in-process recovery)
    if (c.pid == pid && c.err_fd < 0) return c.err->tail();
  }
  auto it = error_tails_.find(pid);
  return it == error_tails_.end() ? "" : it->second;
}

}  // namespace dlrun::launcher
