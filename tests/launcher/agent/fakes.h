// A fake process table and a fake clock for in-process tests of the agent's supervision loop.
// Nothing runs and no time passes except what the test schedules: Wait() jumps the clock to the
// next scheduled event (or to the deadline), so a 30 s grace period takes no time at all.
//
// A test describes each worker by what happens to it after it starts (OnSpawn), e.g. "exits with
// 3 after 2 s" or "heartbeats every second for 5 s"; signals sent to a group are recorded and,
// by default, SIGTERM ends a worker 10 ms later and SIGKILL at once.
#pragma once

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "launcher/agent/agent.h"
#include "launcher/base/file_system.h"
#include "launcher/workers/clock.h"
#include "launcher/workers/processes.h"

namespace dlrun::launcher::testing {

using std::chrono::milliseconds;
using std::chrono::seconds;

class FakeClock final : public Clock {
 public:
  SteadyTime Now() override { return now_; }
  double WallSeconds() override {
    return 1.7e9 + std::chrono::duration<double>(now_ - SteadyTime()).count();
  }
  // Time since the test started.
  milliseconds Elapsed() const { return std::chrono::duration_cast<milliseconds>(now_ - start_); }
  void Set(SteadyTime t) { now_ = t; }

 private:
  SteadyTime start_ = SteadyTime() + std::chrono::hours(1);
  SteadyTime now_ = start_;
};

struct SentSignal {
  pid_t pid;
  int sig;
  milliseconds at;  // FakeClock::Elapsed() when sent
};

class FakeProcesses final : public Processes {
 public:
  struct Proc {
    pid_t pid = 0;
    SpawnSpec spec;
    int attempt = 0;  // how many groups were started before this worker's
    bool exited = false;
    bool ignores_sigterm = false;
    bool unkillable = false;  // stuck in the kernel: not even SIGKILL ends it
  };
  // Called at each Spawn; the test schedules the worker's future with the methods below.
  std::function<void(FakeProcesses&, Proc&)> on_spawn = [](FakeProcesses&, Proc&) {};
  // The file system the agent and these workers share (Harness hands it to the agent): a
  // worker writes its error file here.
  MemoryFileSystem files;

  explicit FakeProcesses(FakeClock& clock) : clock_(clock) {}

  // --- scheduling, relative to now ---
  void ExitAfter(pid_t pid, milliseconds d, int code, double cpu_s = -1,
                 int64_t rss_peak_bytes = 0) {
    At(d, {ProcEvent::Kind::kExited, pid, code, 0, {}, cpu_s, rss_peak_bytes});
  }
  void KilledAfter(pid_t pid, milliseconds d, int sig) { At(d, {ProcEvent::Kind::kExited, pid, 0, sig, {}}); }
  void HeartbeatsEvery(pid_t pid, milliseconds every, milliseconds until) {
    for (milliseconds t = every; t <= until; t += every) At(t, {ProcEvent::Kind::kHeartbeat, pid, 0, 0, {}});
  }
  // A step record (docs/TELEMETRY.md) every `every` until `until`, numbered from 1.
  void StepsEvery(pid_t pid, milliseconds every, milliseconds until, StepRecord step) {
    for (milliseconds t = every; t <= until; t += every) {
      ++step.step;
      At(t, {ProcEvent::Kind::kStep, pid, 0, 0, step});
    }
  }
  // One record (a step or a resume) after `d`.
  void RecordAfter(pid_t pid, milliseconds d, StepRecord r) {
    At(d, {ProcEvent::Kind::kStep, pid, 0, 0, r});
  }
  void SignalAfter(milliseconds d, int sig) { At(d, {ProcEvent::Kind::kSignal, -1, 0, sig, {}}); }

  // --- what happened ---
  std::vector<Proc> procs;  // every worker ever spawned, in order
  std::vector<SentSignal> sent;
  int groups_started() const { return procs.empty() ? 0 : procs.back().attempt + 1; }
  std::vector<SentSignal> SentTo(pid_t pid) const {
    std::vector<SentSignal> out;
    for (const SentSignal& s : sent) {
      if (s.pid == pid) out.push_back(s);
    }
    return out;
  }
  int close_outputs_calls = 0;

  // --- Processes ---
  absl::StatusOr<pid_t> Spawn(const SpawnSpec& spec) override {
    if (spec.local_rank == 0 && !procs.empty()) ++attempt_;
    Proc p;
    p.pid = next_pid_++;
    p.spec = spec;
    p.attempt = attempt_;
    procs.push_back(p);
    on_spawn(*this, procs.back());
    return p.pid;
  }
  void SignalGroup(pid_t pid, int sig) override {
    sent.push_back({pid, sig, clock_.Elapsed()});
    Proc* p = Find(pid);
    if (p == nullptr || p->exited || p->unkillable) return;
    if (sig == SIGKILL) {
      Cancel(pid);
      At(milliseconds(0), {ProcEvent::Kind::kExited, pid, 0, SIGKILL, {}});
    } else if (sig == SIGTERM && !p->ignores_sigterm) {
      Cancel(pid);
      At(milliseconds(10), {ProcEvent::Kind::kExited, pid, 0, SIGTERM, {}});
    } else if (sig == SIGINT || sig == SIGHUP || sig == SIGQUIT) {
      Cancel(pid);
      At(milliseconds(10), {ProcEvent::Kind::kExited, pid, 0, sig, {}});
    }
  }
  std::vector<ProcEvent> Wait(SteadyTime deadline) override {
    TakeWakes(/*block=*/queue_.empty() && deadline == SteadyTime::max());
    if (queue_.empty() && deadline == SteadyTime::max()) {
      throw std::runtime_error("fake processes: Wait() with no deadline and nothing scheduled");
    }
    // A loop that waits again and again without time passing or anything happening is a busy
    // loop in the agent: fail the test instead of spinning forever.
    if (deadline <= clock_.Now() && !Due()) {
      if (++idle_waits_ > 100000) throw std::runtime_error("fake processes: the agent spins");
    } else {
      idle_waits_ = 0;
    }
    auto first = std::min_element(queue_.begin(), queue_.end(),
                                  [](const Item& a, const Item& b) { return a.seq_key() < b.seq_key(); });
    if (first == queue_.end() || first->at > deadline) {
      clock_.Set(std::max(clock_.Now(), deadline));
      return {};
    }
    const SteadyTime t = first->at;
    clock_.Set(std::max(clock_.Now(), t));
    std::vector<ProcEvent> out;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->at == t) {
        if (it->event.kind == ProcEvent::Kind::kExited) {
          Proc* p = Find(it->event.pid);
          if (p != nullptr) p->exited = true;
        }
        out.push_back(it->event);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
  // The agent's words on the workers' control pipes (in-process recovery), in order, and what a
  // worker does when it hears one.
  std::vector<std::pair<pid_t, std::string>> told;
  std::function<void(FakeProcesses&, pid_t, const std::string&)> on_tell =
      [](FakeProcesses&, pid_t, const std::string&) {};
  bool Tell(pid_t pid, const std::string& line) override {
    Proc* p = Find(pid);
    if (p == nullptr || p->exited) return false;
    told.emplace_back(pid, line);
    on_tell(*this, pid, line);
    return true;
  }
  std::vector<SpawnSpec> kept_spares;
  void KeepSpare(const SpawnSpec& spec) override { kept_spares.push_back(spec); }
  // Thread-safe, as the real one (the agent's join runs on a helper thread): delivered by the
  // next Wait, at the fake time then.
  void Wake() override {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      ++wakes_;
    }
    wake_cv_.notify_all();
  }
  // How many times Wait found nothing scheduled and blocked for a Wake from another thread.
  int blocked_waits() const {
    std::lock_guard<std::mutex> lock(wake_mu_);
    return blocked_waits_;
  }
  void CloseOutputs() override { ++close_outputs_calls; }
  // What a test says a worker wrote to stderr, and the cgroup's OOM-kill count.
  std::map<pid_t, std::string> error_tails;
  struct Facts final : ProcessFacts {
    int64_t oom_kills = -1;
    int64_t OomKills() const override { return oom_kills; }
    std::map<pid_t, std::string> blocked_calls;  // /proc/PID/syscall's text, by pid
    std::string BlockedCall(pid_t pid) const override {
      auto it = blocked_calls.find(pid);
      return it == blocked_calls.end() ? "" : it->second;
    }
  } facts_said;
  std::string ErrorTail(pid_t pid) const override {
    auto it = error_tails.find(pid);
    return it == error_tails.end() ? "" : it->second;
  }
  const ProcessFacts& facts() const override { return facts_said; }

 private:
  struct Item {
    SteadyTime at;
    uint64_t seq;
    ProcEvent event;
    std::pair<SteadyTime, uint64_t> seq_key() const { return {at, seq}; }
  };
  // Schedules the wakes that came since (now); with `block`, first waits up to 10 s of real
  // time for one (a helper thread's), as a real Wait with nothing else to come would.
  void TakeWakes(bool block) {
    std::unique_lock<std::mutex> lock(wake_mu_);
    if (block && wakes_ == 0) {
      ++blocked_waits_;
      wake_cv_.notify_all();
      wake_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return wakes_ > 0; });
    }
    for (; wakes_ > 0; --wakes_) At(milliseconds(0), {ProcEvent::Kind::kWake, -1, 0, 0, {}});
  }
  bool Due() const {
    for (const Item& i : queue_) {
      if (i.at <= clock_.Now()) return true;
    }
    return false;
  }
  void At(milliseconds d, ProcEvent e) { queue_.push_back({clock_.Now() + d, seq_++, e}); }
  // A worker that is ended by a signal does nothing it had planned afterwards.
  void Cancel(pid_t pid) {
    queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                                [&](const Item& i) { return i.event.pid == pid; }),
                 queue_.end());
  }
  Proc* Find(pid_t pid) {
    for (Proc& p : procs) {
      if (p.pid == pid) return &p;
    }
    return nullptr;
  }

  FakeClock& clock_;
  mutable std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  int wakes_ = 0, blocked_waits_ = 0;
  std::vector<Item> queue_;
  uint64_t seq_ = 0;
  pid_t next_pid_ = 1000;
  int attempt_ = 0;
  int idle_waits_ = 0;
};

// A membership source whose verdicts the test scripts: Check() returns `verdicts` in order
// (then kContinue), after success it returns `after_success` (default kFinished).
class ScriptedSource final : public MembershipSource, public JobChannel {
 public:
  ScriptedSource(Assignment base, int max_restarts, milliseconds interval)
      : base_(std::move(base)), max_restarts_(max_restarts), interval_(interval) {}
  std::vector<std::pair<Verdict, std::string>> verdicts;
  Verdict after_success = Verdict::kFinished;
  int nexts = 0, failures = 0, checks = 0, successes = 0;
  std::vector<std::string> failure_reasons;
  std::vector<std::string> fallback_reasons;  // restarts in place of an in-process recovery
  // A join that blocks, as the rendezvous's does: the agent runs Next() on a helper thread,
  // which first calls `on_next` (the test's hold on the join).
  bool next_may_block = false;
  std::function<void()> on_next = [] {};

  absl::StatusOr<Assignment> Next() override {
    on_next();
    Assignment a = base_;
    a.restart_count = failures;
    a.max_restarts = max_restarts_;
    a.round = static_cast<uint64_t>(++nexts);
    waiting_for_others_ = false;
    return a;
  }
  bool NextMayBlock() const override { return next_may_block; }
  bool OnFailure(const std::string& reason, bool fatal) override {
    failure_reasons.push_back(reason);
    return failures++ < max_restarts_;
  }
  bool OnFallback(const std::string& reason) override {
    fallback_reasons.push_back(reason);
    return true;
  }
  Verdict Check(std::string* reason) override {
    ++checks;
    if (waiting_for_others_) return after_success;
    if (verdicts.empty()) return Verdict::kContinue;
    auto [v, r] = verdicts.front();
    verdicts.erase(verdicts.begin());
    *reason = r;
    return v;
  }
  milliseconds check_interval() const override { return interval_; }
  void OnSuccess() override {
    ++successes;
    waiting_for_others_ = true;
  }
  std::vector<telemetry::NodeTelemetry> published;
  std::vector<int> successes_at_publish;  // OnSuccess() calls so far, at each Publish
  void Publish(const telemetry::NodeTelemetry& t) override {
    published.push_back(t);
    successes_at_publish.push_back(successes);
  }
  std::shared_ptr<telemetry::JobTelemetry> job_telemetry() const override { return nullptr; }

 private:
  Assignment base_;
  int max_restarts_;
  milliseconds interval_;
  bool waiting_for_others_ = false;
};

}  // namespace dlrun::launcher::testing
