// In-process recovery (agent.h; docs/RECOVERY.md, "A fault costs one step"): a worker of a
// program that declared it dies; the survivors keep running, the lost local rank starts again
// (a warm spare takes its place when there is one) with contract::kRecoveryGen, and every survivor
// is told the group's next generation on its control pipe. The recovery ends when every rank
// said it holds the same state (a "P" record); anything else falls back to the ordinary
// failure path: a failure during it, or no end within options_.recovery_timeout.
#include <signal.h>
#include <string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/contract.h"
#include "common/signal_name.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/spawn_spec.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

// One line per lost rank (what it left: its error file's first line, else its signal or
// code), noted in the report's failures.
std::vector<std::string> Agent::NoteLost(const std::vector<WorkerExit>& lost) {
  std::vector<std::string> said;
  for (const WorkerExit& e : lost) {
    const ErrorRecord rec = run_dir_.ReadErrorRecord(attempt_, e.local_rank);
    std::string what = rec.message.empty()
                           ? (e.signal != 0 ? absl::StrCat("SIG", dlrun::SignalAbbrev(e.signal))
                                            : absl::StrCat("exit code ", e.exit_code))
                           : rec.message.substr(0, rec.message.find('\n'));
    said.push_back(absl::StrCat("rank ", e.global_rank, " (local rank ", e.local_rank, ", pid ",
                                e.pid, "): ", what));
    const Classification cls = ClassifyFailure(
        e, absl::StrCat(rec.message, "\n", rec.traceback, "\n", processes_.ErrorTail(e.pid)), false);
    telemetry_.NoteFailure({e.global_rank, options_.hostname, FailureClassName(cls.cls), what,
                            {}, {}, {}});
  }
  return said;
}

// Starts each lost local rank again (a warm spare when there is one) in generation
// `generation` of the group `next`; false when one cannot be started.
bool Agent::StartReplacements(const std::vector<WorkerExit>& lost, const Assignment& next,
                              int generation, std::vector<std::string>* replaced) {
  for (const WorkerExit& e : lost) {
    SpawnSpec spec = MakeSpawnSpec(options_, next, run_dir_, attempt_, e.local_rank);
    spec.env[contract::kRecoveryGen] = absl::StrCat(generation);
    // The lost worker's logs stay: the replacement writes beside them.
    for (StreamRoute* r : {&spec.out, &spec.err}) {
      if (r->log_path.empty()) continue;
      const size_t dot = r->log_path.rfind(".log");
      r->log_path = absl::StrCat(r->log_path.substr(0, dot), ".gen", generation, ".log");
    }
    absl::StatusOr<pid_t> pid = processes_.Spawn(spec);
    if (!pid.ok()) {
      spdlog::warn("no in-process recovery: cannot start local rank {} again: {}", e.local_rank,
                   std::string(pid.status().message()));
      return false;
    }
    for (Worker& w : workers_) {
      if (w.local_rank != e.local_rank) continue;
      w.pid = *pid;
      w.alive = true;
      hang_.Add(w.pid);
      w.recoverable = true;  // the same program; it declares again at start
      replaced->push_back(absl::StrCat("local rank ", w.local_rank, " as pid ", w.pid));
    }
  }
  return true;
}

std::vector<RecoveryMachine::Member> Agent::Members() const {
  std::vector<RecoveryMachine::Member> members;
  for (const Worker& w : workers_) {
    members.push_back({w.local_rank, w.pid, w.alive, w.recoverable});
  }
  return members;
}

bool Agent::RecoverInProcess() {
  using Kind = RecoveryMachine::Decision::Kind;
  RecoveryMachine::Decision d =
      recovery_.Failed(Members(), exits_, current_, stopping_,
                       [this](int rank) { return telemetry_.LastStep(rank); });
  if (d.kind != Kind::kRecover) {
    if (!d.why.empty()) spdlog::warn("no in-process recovery: {}", d.why);
    return false;
  }
  const SteadyTime t = clock_.Now();
  telemetry_.FaultSeen(t);
  int port = 0;
  if (d.needs_port) {
    port = options_.pick_master_port(current_.master_addr);
    if (port <= 0) {
      spdlog::warn("no in-process recovery: {}",
                   recovery_.Abandon(absl::StrCat("no free port for the new group on ",
                                                  current_.master_addr)).why);
      return false;
    }
  }
  d.said = NoteLost(d.lost);  // before the fresh error files
  if (recovery_.across_nodes()) {
    std::vector<int> ranks;
    for (const WorkerExit& e : d.lost) ranks.push_back(e.global_rank);
    const absl::StatusOr<RegroupLink::Notice> asked =
        regroup_->Ask(d.generation, ranks, port, absl::StrJoin(d.said, "; "));
    const RecoveryMachine::Decision a =
        recovery_.Asked(asked.status(), std::move(d.lost), std::move(d.said), t);
    if (a.kind == Kind::kFallBack) {
      spdlog::warn("no in-process recovery: {}", a.why);
      return false;
    }
    DropFailedExits();
    spdlog::info("in-process recovery across nodes: generation {} asked of the job{}",
                 d.generation, port > 0 ? absl::StrCat(" (master port ", port, ")") : "");
    return true;
  }
  d.next = current_;
  d.next.master_port = port;
  d.fault = t;
  return Begin(d);
}

void Agent::DropFailedExits() {
  // The lost ones are replaced: their exits are history, not this group's failure.
  exits_.erase(std::remove_if(exits_.begin(), exits_.end(),
                              [](const WorkerExit& e) { return e.failed(); }),
               exits_.end());
}

bool Agent::Begin(const RecoveryMachine::Decision& d) {
  std::vector<std::string> replaced;
  const bool started = StartReplacements(d.lost, d.next, d.generation, &replaced);
  std::vector<pid_t> pids;
  for (const Worker& w : workers_) pids.push_back(w.pid);
  const int64_t lost_step =
      d.lost.empty() ? -1 : telemetry_.LastStep(d.lost.front().global_rank);
  if (recovery_.Began(started, d, pids, lost_step).kind != RecoveryMachine::Decision::Kind::kNone) {
    return false;
  }
  // Every survivor hears of the new group; every rank is to say it holds the state. When the
  // group's nodes changed (a node lost), the word carries each rank's new place.
  const Assignment& next = d.next;
  const bool moved = next.world_size != current_.world_size ||
                     next.rank_offset != current_.rank_offset ||
                     next.master_addr != current_.master_addr;
  for (Worker& w : workers_) {
    w.rank = next.rank_offset + w.local_rank;
    const bool replacement = std::any_of(d.lost.begin(), d.lost.end(), [&](const WorkerExit& e) {
      return e.local_rank == w.local_rank;
    });
    std::string word = absl::StrCat(contract::kRegroupWord, " ", d.generation, " ",
                                    next.master_port);
    if (moved) absl::StrAppend(&word, " ", w.rank, " ", next.world_size, " ", next.master_addr);
    word += "\n";
    if (!replacement && !processes_.Tell(w.pid, word)) {
      spdlog::warn("in-process recovery: cannot tell local rank {} (pid {}) the new group",
                   w.local_rank, w.pid);
    }
  }
  DropFailedExits();
  current_ = next;
  std::vector<AgentTelemetry::Member> members;
  std::vector<DumpTarget> group;
  for (const Worker& w : workers_) {
    members.push_back({w.rank, w.local_rank, w.pid, true});
    group.push_back({w.rank, w.local_rank, w.pid});
  }
  telemetry_.Replaced(std::move(members), current_, d.fault, d.generation);
  WriteWorkersFile(group);
  spdlog::warn("{}; in-process recovery: the {} other rank(s) {}keep running, {} (generation {}, "
               "master port {})",
               absl::StrJoin(d.said, "; "), workers_.size() - d.lost.size(),
               recovery_.across_nodes() ? "of this node " : "",
               replaced.empty() ? "none to replace here" : absl::StrJoin(replaced, ", "),
               d.generation, next.master_port);
  return true;
}

std::optional<Agent::Watch> Agent::FollowRegroup() {
  using Kind = RecoveryMachine::Decision::Kind;
  if (!recovery_.across_nodes()) return std::nullopt;
  RegroupLink::Notice n = regroup_->Latest();
  RecoveryMachine::Decision d =
      recovery_.Noticed(n, current_, regroup_->node_id(), Members(), clock_.Now());
  if (d.kind == Kind::kPostPort) {
    const int port =
        options_.pick_master_port ? options_.pick_master_port(d.next.master_addr) : 0;
    absl::StatusOr<RegroupLink::Notice> posted =
        port > 0 ? regroup_->Ask(d.generation, {}, port, "")
                 : absl::UnavailableError(absl::StrCat("no free port on ", d.next.master_addr));
    d = recovery_.Posted(posted.status(), d.generation);
    if (posted.ok()) {
      d = recovery_.Noticed(*posted, current_, regroup_->node_id(), Members(), clock_.Now());
    }
  }
  switch (d.kind) {
    case Kind::kUnrecovered:
      return Watch{Watch::Outcome::kUnrecovered, d.why, 0};
    case Kind::kBegin:
      if (d.elsewhere) telemetry_.FaultSeen(d.fault, d.admission);
      if (!Begin(d)) {
        return Watch{Watch::Outcome::kUnrecovered,
                     absl::StrCat("generation ", d.generation, " could not start here"), 0};
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

void Agent::TellInProcess() {
  if (!recovery_.across_nodes()) return;
  bool all = !workers_.empty() && static_cast<bool>(options_.pick_master_port);
  for (const Worker& w : workers_) all = all && w.recoverable;
  regroup_->SetInProcess(all);
}

void Agent::SpareOnDeclaration(int local_rank) {
  if (!options_.spares_on_declaration || (!options_.single_node_job && !regroup_) ||
      options_.recovery == AgentOptions::Recovery::kRestart) {
    return;
  }
  const std::vector<std::string>& held = options_.spare_argv_on_declaration;
  if (options_.spare_argv.empty()) {
    // Every later spawn promotes and replaces a spare: the program's own command (C++), or the
    // Python bootstrap held back until now (--max-restarts 0).
    options_.spare_argv = held.empty() ? options_.argv : held;
    telemetry_.SetWarmSpares(true);
  } else if (options_.spare_argv != options_.argv && options_.spare_argv != held) {
    return;  // a Python worker's spares are in place already (spare_bootstrap)
  }
  processes_.KeepSpare(MakeSpawnSpec(options_, current_, run_dir_, attempt_, local_rank));
}

void Agent::StateFromPeer(pid_t pid, int64_t step) {
  const RecoveryMachine::Decision d = recovery_.StateFromPeer(pid, step, clock_.Now());
  if (d.kind != RecoveryMachine::Decision::Kind::kDone) return;
  telemetry_.RecoveryDone(d.fault);
  spdlog::info("in-process recovery done: every rank holds the state of step {} (generation {}, "
               "{:.3f} s after the fault)",
               d.step, d.generation, d.seconds);
}

}  // namespace dlrun::launcher
