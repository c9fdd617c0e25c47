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

bool Agent::CanRecoverInProcess(std::string* why_not) const {
  if (options_.recovery == AgentOptions::Recovery::kRestart || !options_.pick_master_port) {
    return false;  // not asked for: nothing to say
  }
  bool any_declared = false;
  for (const Worker& w : workers_) any_declared = any_declared || w.recoverable;
  if (!any_declared) return false;  // an undeclared program: torchrun's semantics, silently
  if (recovery_deadline_) {
    *why_not = "another rank failed during the in-process recovery";
  } else if (!options_.single_node_job && !regroup_) {
    *why_not = "this job's nodes cannot regroup (a static multi-node rendezvous)";
  } else if (stopping_) {
    *why_not = "the group is being stopped";
  }
  for (const Worker& w : workers_) {
    if (why_not->empty() && !w.recoverable) {
      *why_not = absl::StrCat("local rank ", w.local_rank, " did not declare in-process recovery");
    }
  }
  int failed = 0;
  for (const WorkerExit& e : exits_) {
    if (why_not->empty() && !e.failed()) {  // a recovery needs every survivor in its loop
      *why_not = absl::StrCat("rank ", e.global_rank, " already finished its work");
    }
    if (!e.failed()) continue;
    ++failed;
    if (why_not->empty() && last_recovered_ && last_recovered_->first == e.global_rank &&
        last_recovered_->second == telemetry_.LastStep(e.global_rank)) {
      *why_not = absl::StrCat("rank ", e.global_rank, " failed at step ", last_recovered_->second,
                              " again after an in-process recovery");
    }
  }
  if (why_not->empty() && failed == static_cast<int>(workers_.size())) {
    *why_not = "no rank survived";
  }
  return why_not->empty();
}

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

bool Agent::RecoverInProcess() {
  std::string why_not;
  if (!CanRecoverInProcess(&why_not)) {
    if (!why_not.empty()) spdlog::warn("no in-process recovery: {}", why_not);
    return false;
  }
  const SteadyTime t = clock_.Now();
  telemetry_.FaultSeen(t);
  // The new group's port: this node's pick alone, or across nodes the pick of global rank 0's.
  int port = 0;
  if (!AcrossNodes() || current_.rank_offset == 0) {
    port = options_.pick_master_port(current_.master_addr);
    if (port <= 0) {
      spdlog::warn("no in-process recovery: no free port for the new group on {}",
                   current_.master_addr);
      return false;
    }
  }
  std::vector<WorkerExit> lost;
  for (const WorkerExit& e : exits_) {
    if (e.failed()) lost.push_back(e);
  }
  const std::vector<std::string> said = NoteLost(lost);  // before the fresh error files
  if (AcrossNodes()) return AskToRegroup(lost, said, port, t);
  Assignment next = current_;
  next.master_port = port;
  return BeginGeneration(next, generation_ + 1, lost, said, t);
}

bool Agent::BeginGeneration(const Assignment& next, int generation,
                            const std::vector<WorkerExit>& lost,
                            const std::vector<std::string>& said, SteadyTime t) {
  std::vector<std::string> replaced;
  if (!StartReplacements(lost, next, generation, &replaced)) return false;
  // Every survivor hears of the new group; every rank is to say it holds the state. When the
  // group's nodes changed (a node lost), the word carries each rank's new place.
  awaiting_state_.clear();
  const bool moved = next.world_size != current_.world_size ||
                     next.rank_offset != current_.rank_offset ||
                     next.master_addr != current_.master_addr;
  for (Worker& w : workers_) {
    awaiting_state_.push_back(w.pid);
    w.rank = next.rank_offset + w.local_rank;
    const bool replacement = std::any_of(lost.begin(), lost.end(), [&](const WorkerExit& e) {
      return e.local_rank == w.local_rank;
    });
    std::string word = absl::StrCat(contract::kRegroupWord, " ", generation, " ", next.master_port);
    if (moved) absl::StrAppend(&word, " ", w.rank, " ", next.world_size, " ", next.master_addr);
    word += "\n";
    if (!replacement && !processes_.Tell(w.pid, word)) {
      spdlog::warn("in-process recovery: cannot tell local rank {} (pid {}) the new group",
                   w.local_rank, w.pid);
    }
  }
  // The lost ones are replaced: their exits are history, not this group's failure.
  exits_.erase(std::remove_if(exits_.begin(), exits_.end(),
                              [](const WorkerExit& e) { return e.failed(); }),
               exits_.end());
  current_ = next;
  generation_ = generation;
  recovery_started_ = t;
  recovery_deadline_ = t + options_.recovery_timeout;
  recovering_from_ = absl::StrJoin(said, "; ");
  if (!lost.empty()) {
    last_recovered_ = {lost.front().global_rank, telemetry_.LastStep(lost.front().global_rank)};
  }
  std::vector<AgentTelemetry::Member> members;
  std::vector<DumpTarget> group;
  for (const Worker& w : workers_) {
    members.push_back({w.rank, w.local_rank, w.pid, true});
    group.push_back({w.rank, w.local_rank, w.pid});
  }
  telemetry_.Replaced(std::move(members), current_, t, generation);
  WriteWorkersFile(group);
  spdlog::warn("{}; in-process recovery: the {} other rank(s) {}keep running, {} (generation {}, "
               "master port {})",
               absl::StrJoin(said, "; "), workers_.size() - lost.size(),
               AcrossNodes() ? "of this node " : "",
               replaced.empty() ? "none to replace here" : absl::StrJoin(replaced, ", "),
               generation, next.master_port);
  return true;
}

bool Agent::AskToRegroup(const std::vector<WorkerExit>& lost, const std::vector<std::string>& said,
                         int port, SteadyTime t) {
  std::vector<int> ranks;
  for (const WorkerExit& e : lost) ranks.push_back(e.global_rank);
  const absl::StatusOr<RegroupLink::Notice> asked =
      regroup_->Ask(generation_ + 1, ranks, port, absl::StrJoin(said, "; "));
  if (!asked.ok()) {
    spdlog::warn("no in-process recovery: the job did not regroup: {}",
                 std::string(asked.status().message()));
    return false;
  }
  pending_lost_ = lost;
  pending_said_ = said;
  exits_.erase(std::remove_if(exits_.begin(), exits_.end(),
                              [](const WorkerExit& e) { return e.failed(); }),
               exits_.end());
  recovery_started_ = t;
  recovery_deadline_ = t + options_.recovery_timeout;
  spdlog::info("in-process recovery across nodes: generation {} asked of the job{}",
               generation_ + 1, port > 0 ? absl::StrCat(" (master port ", port, ")") : "");
  return true;
}

// A node lost and the job going on without it: this node's new place in `next`; false when it
// was left out.
bool Agent::TakePlace(const RegroupLink::Notice& n, Assignment* next) const {
  for (const RegroupLink::Notice::Place& p : n.places) {
    if (p.node_id != regroup_->node_id()) continue;
    next->node_rank = p.node_rank;
    next->rank_offset = p.rank_offset;
    next->num_nodes = static_cast<int>(n.places.size());
    next->world_size = n.world_size;
    next->master_addr = n.master_addr;
    return true;
  }
  return false;
}

std::optional<Agent::Watch> Agent::FollowRegroup() {
  if (!AcrossNodes()) return std::nullopt;
  RegroupLink::Notice n = regroup_->Latest();
  if (n.generation <= generation_) return std::nullopt;
  Assignment next = current_;
  if (!n.places.empty() && !TakePlace(n, &next)) {
    return Watch{
        Watch::Outcome::kUnrecovered,
        absl::StrCat("generation ", n.generation, " goes on without this node (", n.reason, ")"),
        0};
  }
  if (n.master_port == 0 && next.rank_offset == 0 && posted_for_ != n.generation) {
    posted_for_ = n.generation;  // global rank 0's node picks the new group's port
    const int port = options_.pick_master_port ? options_.pick_master_port(next.master_addr) : 0;
    absl::StatusOr<RegroupLink::Notice> posted =
        port > 0 ? regroup_->Ask(n.generation, {}, port, "")
                 : absl::UnavailableError(absl::StrCat("no free port on ", next.master_addr));
    if (!posted.ok()) {
      return Watch{Watch::Outcome::kUnrecovered,
                   absl::StrCat("cannot post the port of generation ", n.generation, ": ",
                                posted.status().message()),
                   0};
    }
    n = *posted;
  }
  if (n.master_port == 0) return std::nullopt;  // posted soon by global rank 0's node
  const SteadyTime t = pending_lost_.empty() ? clock_.Now() : recovery_started_;
  std::vector<std::string> said = std::move(pending_said_);
  if (pending_lost_.empty()) {  // another node's loss, or a node admitted (the group grows)
    telemetry_.FaultSeen(t, !n.places.empty() && n.world_size > current_.world_size);
    said = {n.places.empty() ? absl::StrCat(n.reason.empty() ? "a rank was lost" : n.reason,
                                            " (on node ", n.asked_by, ")")
                             : absl::StrCat(n.reason, "; the job goes on with ", n.world_size,
                                            " rank(s) on ", n.places.size(), " node(s)")};
    for (const Worker& w : workers_) {
      if (!w.recoverable || !w.alive) {
        return Watch{Watch::Outcome::kUnrecovered,
                     absl::StrCat(said.front(), ": local rank ", w.local_rank,
                                  w.alive ? " did not declare in-process recovery" : " is gone"),
                     0};
      }
    }
  }
  next.master_port = n.master_port;
  const std::vector<WorkerExit> lost = std::move(pending_lost_);
  pending_lost_.clear();
  pending_said_.clear();
  if (!BeginGeneration(next, n.generation, lost, said, t)) {
    return Watch{Watch::Outcome::kUnrecovered,
                 absl::StrCat("generation ", n.generation, " could not start here"), 0};
  }
  return std::nullopt;
}

std::string Agent::UnrecoveredReason() const {
  if (!pending_lost_.empty()) {
    return absl::StrCat("in-process recovery: generation ", generation_ + 1,
                        " asked of the job did not begin within ",
                        options_.recovery_timeout.count(), " ms (its master port never came)");
  }
  return absl::StrCat("in-process recovery (generation ", generation_, ") did not end within ",
                      options_.recovery_timeout.count(), " ms: ", awaiting_state_.size(),
                      " rank(s) never said they hold the state");
}

void Agent::TellInProcess() {
  if (!AcrossNodes()) return;
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
  auto it = std::find(awaiting_state_.begin(), awaiting_state_.end(), pid);
  if (it == awaiting_state_.end()) return;
  awaiting_state_.erase(it);
  if (!awaiting_state_.empty() || !recovery_deadline_) return;
  recovery_deadline_.reset();
  telemetry_.RecoveryDone(clock_.Now());
  const double s =
      std::chrono::duration<double>(clock_.Now() - recovery_started_).count();
  spdlog::info("in-process recovery done: every rank holds the state of step {} (generation {}, "
               "{:.3f} s after the fault)",
               step, generation_, s);
}

}  // namespace dlrun::launcher
