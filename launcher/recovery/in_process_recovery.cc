// In-process recovery (in_process_recovery.h; docs/RECOVERY.md, "A fault costs one step"): a worker
// of a program that declared it dies; the survivors keep running, the lost local rank starts again
// (a warm spare takes its place when there is one) with contract::kRecoveryGen, and every survivor
// is told the group's next generation on its control pipe. The recovery ends when every rank
// said it holds the same state (a "P" record); anything else falls back to the ordinary
// failure path: a failure during it, or no end within s_.options.recovery_timeout.
#include <signal.h>
#include <string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/contract.h"
#include "common/signal_name.h"
#include "launcher/recovery/in_process_recovery.h"
#include "launcher/workers/spawn_spec.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

// The group's workers as the machine sees them.
std::vector<RecoveryMachine::Member> MembersOf(const std::vector<GroupWorker>& workers) {
  std::vector<RecoveryMachine::Member> members;
  for (const GroupWorker& w : workers) {
    members.push_back({w.local_rank, w.pid, w.alive, w.recoverable});
  }
  return members;
}

}  // namespace

InProcessRecovery::InProcessRecovery(Seams seams, std::shared_ptr<RegroupLink> regroup)
    : s_(seams),
      regroup_(std::move(regroup)),
      machine_({.asked_for = s_.options.recovery != AgentOptions::Recovery::kRestart &&
                             static_cast<bool>(s_.options.pick_master_port),
                .single_node_job = s_.options.single_node_job,
                .can_regroup = regroup_ != nullptr,
                .timeout = s_.options.recovery_timeout}) {
  if (regroup_) regroup_->Watch([procs = &s_.processes] { procs->Wake(); });
}

void InProcessRecovery::GroupStarted(SteadyTime now) {
  const int admitted_at = s_.group.current().recovery_generation;
  machine_.GroupStarted(admitted_at, PidsOf(s_.group.workers()), now);
  if (admitted_at > 0) {
    spdlog::info(
        "admitted into the running group at generation {} (master port {}): every "
        "rank here takes the state from a peer",
        admitted_at, s_.group.current().master_port);
  }
  TellInProcess();
}

std::optional<std::string> InProcessRecovery::Tick() {
  const RecoveryMachine::Decision d = machine_.Tick(s_.clock.Now(), s_.group.exits());
  if (d.kind == RecoveryMachine::Decision::Kind::kUnrecovered) return d.why;
  return std::nullopt;
}

void InProcessRecovery::Record(pid_t pid, RecordKind kind, int64_t step) {
  const int local_rank = s_.group.Declared(pid);
  if (kind == RecordKind::kDeclared && local_rank >= 0) SpareOnDeclaration(local_rank);
  if (kind == RecordKind::kFromPeer) {
    const RecoveryMachine::Decision d = machine_.StateFromPeer(pid, step, s_.clock.Now());
    if (d.kind == RecoveryMachine::Decision::Kind::kDone) {
      s_.telemetry.RecoveryDone(d.fault);
      spdlog::info(
          "in-process recovery done: every rank holds the state of step {} "
          "(generation {}, {:.3f} s after the fault)",
          d.step, d.generation, d.seconds);
    }
  }
  TellInProcess();
}

// One line per lost rank (what it left: its error file's first line, else its signal or
// code), noted in the report's failures.
std::vector<std::string> InProcessRecovery::NoteLost(const std::vector<WorkerExit>& lost) {
  std::vector<std::string> said;
  for (const WorkerExit& e : lost) {
    const ErrorRecord rec = s_.run_dir.ReadErrorRecord(s_.group.attempt(), e.local_rank);
    std::string what = rec.message.empty()
                           ? (e.signal != 0 ? absl::StrCat("SIG", dlrun::SignalAbbrev(e.signal))
                                            : absl::StrCat("exit code ", e.exit_code))
                           : rec.message.substr(0, rec.message.find('\n'));
    said.push_back(absl::StrCat("rank ", e.global_rank, " (local rank ", e.local_rank, ", pid ",
                                e.pid, "): ", what));
    const Classification cls = ClassifyFailure(
        e, absl::StrCat(rec.message, "\n", rec.traceback, "\n", s_.processes.ErrorTail(e.pid)),
        false);
    s_.telemetry.NoteFailure(
        {e.global_rank, s_.options.hostname, FailureClassName(cls.cls), what, {}, {}, {}, {}});
  }
  return said;
}

bool InProcessRecovery::Recover() {
  using Kind = RecoveryMachine::Decision::Kind;
  RecoveryMachine::Decision d = machine_.Failed(
      MembersOf(s_.group.workers()), s_.group.exits(), s_.group.current(), s_.group.stopping(),
      [this](int rank) { return s_.telemetry.steps().LastStep(rank); });
  if (d.kind != Kind::kRecover) {
    if (!d.why.empty()) spdlog::warn("no in-process recovery: {}", d.why);
    return false;
  }
  const SteadyTime t = s_.clock.Now();
  s_.telemetry.FaultSeen(t);
  const Assignment& current = s_.group.current();
  int port = 0;
  if (d.needs_port) {
    port = s_.options.pick_master_port(current.master_addr);
    if (port <= 0) {
      spdlog::warn(
          "no in-process recovery: {}",
          machine_.Abandon(absl::StrCat("no free port for the new group on ", current.master_addr))
              .why);
      return false;
    }
  }
  d.said = NoteLost(d.lost);  // before the fresh error files
  if (machine_.across_nodes()) {
    std::vector<int> ranks;
    for (const WorkerExit& e : d.lost) ranks.push_back(e.global_rank);
    const absl::StatusOr<RegroupLink::Notice> asked =
        regroup_->Ask(d.generation, ranks, port, absl::StrJoin(d.said, "; "));
    const RecoveryMachine::Decision a =
        machine_.Asked(asked.status(), std::move(d.lost), std::move(d.said), t);
    if (a.kind == Kind::kFallBack) {
      spdlog::warn("no in-process recovery: {}", a.why);
      return false;
    }
    s_.group.DropFailedExits();  // the lost ones are replaced once the port comes
    spdlog::info("in-process recovery across nodes: generation {} asked of the job{}", d.generation,
                 port > 0 ? absl::StrCat(" (master port ", port, ")") : "");
    return true;
  }
  d.next = current;
  d.next.master_port = port;
  d.fault = t;
  return Begin(d).kind == Kind::kNone;
}

RecoveryMachine::Decision InProcessRecovery::Begin(const RecoveryMachine::Decision& d) {
  std::vector<std::string> replaced;
  const bool started = s_.group.Replace(d.lost, d.next, d.generation, &replaced);
  const int64_t lost_step =
      d.lost.empty() ? -1 : s_.telemetry.steps().LastStep(d.lost.front().global_rank);
  RecoveryMachine::Decision began =
      machine_.Began(started, d, PidsOf(s_.group.workers()), lost_step);
  if (began.kind != RecoveryMachine::Decision::Kind::kNone) return began;
  // Every survivor hears of the new group; every rank is to say it holds the state. When the
  // group's nodes changed (a node lost), the word carries each rank's new place.
  const Assignment& next = d.next;
  const Assignment& current = s_.group.current();
  const bool moved = next.world_size != current.world_size ||
                     next.rank_offset != current.rank_offset ||
                     next.master_addr != current.master_addr;
  s_.group.MoveTo(next);
  for (const WorkerGroup::Worker& w : s_.group.workers()) {
    const bool replacement = std::any_of(d.lost.begin(), d.lost.end(), [&](const WorkerExit& e) {
      return e.local_rank == w.local_rank;
    });
    if (replacement) {  // a new process: the hang watch follows it; it is not told
      s_.hang.Add(w.pid);
      continue;
    }
    std::string word =
        absl::StrCat(contract::kRegroupWord, " ", d.generation, " ", next.master_port);
    if (moved) absl::StrAppend(&word, " ", w.rank, " ", next.world_size, " ", next.master_addr);
    word += "\n";
    if (!s_.processes.Tell(w.pid, word)) {
      spdlog::warn("in-process recovery: cannot tell local rank {} (pid {}) the new group",
                   w.local_rank, w.pid);
    }
  }
  s_.group.DropFailedExits();  // the lost ones' exits are history, not this group's failure
  std::vector<AgentTelemetry::Member> members;
  for (const WorkerGroup::Worker& w : s_.group.workers()) {
    members.push_back({w.rank, w.local_rank, w.pid, true, s_.processes.HowStarted(w.pid)});
  }
  s_.telemetry.Replaced(std::move(members), next, d.fault, d.generation);
  s_.group.WriteWorkersFile(s_.channel.Address());
  spdlog::warn(
      "{}; in-process recovery: the {} other rank(s) {}keep running, {} (generation {}, "
      "master port {})",
      absl::StrJoin(d.said, "; "), s_.group.workers().size() - d.lost.size(),
      machine_.across_nodes() ? "of this node " : "",
      replaced.empty() ? "none to replace here" : absl::StrJoin(replaced, ", "), d.generation,
      next.master_port);
  return began;
}

std::optional<std::string> InProcessRecovery::Follow() {
  using Kind = RecoveryMachine::Decision::Kind;
  if (!machine_.across_nodes()) return std::nullopt;
  RegroupLink::Notice n = regroup_->Latest();
  RecoveryMachine::Decision d = machine_.Noticed(n, s_.group.current(), regroup_->node_id(),
                                                 MembersOf(s_.group.workers()), s_.clock.Now());
  if (d.kind == Kind::kPostPort) {
    const int port =
        s_.options.pick_master_port ? s_.options.pick_master_port(d.next.master_addr) : 0;
    absl::StatusOr<RegroupLink::Notice> posted =
        port > 0 ? regroup_->Ask(d.generation, {}, port, "")
                 : absl::UnavailableError(absl::StrCat("no free port on ", d.next.master_addr));
    d = machine_.Posted(posted.status(), d.generation);
    if (posted.ok()) {
      d = machine_.Noticed(*posted, s_.group.current(), regroup_->node_id(),
                           MembersOf(s_.group.workers()), s_.clock.Now());
    }
  }
  switch (d.kind) {
    case Kind::kUnrecovered:
      return d.why;
    case Kind::kBegin:
      if (d.elsewhere) s_.telemetry.FaultSeen(d.fault, d.admission);
      if (RecoveryMachine::Decision began = Begin(d); began.kind != Kind::kNone) {
        return began.why;  // the generation could not start here
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

void InProcessRecovery::TellInProcess() {
  if (!machine_.across_nodes()) return;
  regroup_->SetInProcess(static_cast<bool>(s_.options.pick_master_port) &&
                         AllDeclared(s_.group.workers()));
}

void InProcessRecovery::SpareOnDeclaration(int local_rank) {
  if (!s_.options.spares_on_declaration || (!s_.options.single_node_job && !regroup_) ||
      s_.options.recovery == AgentOptions::Recovery::kRestart) {
    return;
  }
  const std::vector<std::string>& held = s_.options.spare_argv_on_declaration;
  std::vector<std::string>& spare_argv = s_.group.spare_argv();
  if (spare_argv.empty()) {
    // Every later spawn promotes and replaces a spare: the program's own command (C++), or the
    // Python bootstrap held back until now (--max-restarts 0).
    spare_argv = held.empty() ? s_.options.argv : held;
    s_.telemetry.SetWarmSpares(true);
  } else if (spare_argv != s_.options.argv && spare_argv != held) {
    return;  // a Python worker's spares are in place already (spare_bootstrap)
  }
  s_.processes.KeepSpare(MakeSpawnSpec(s_.options, spare_argv, s_.group.current(), s_.run_dir,
                                       s_.group.attempt(), local_rank));
}

}  // namespace dlrun::launcher
