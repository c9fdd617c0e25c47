// The end-of-job report with its advice (docs/TELEMETRY.md).
#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "telemetry/profile_json.h"
#include "telemetry/summary.h"
#include "telemetry/telemetry.h"

namespace dlrun::telemetry {

namespace {

// A memory size in MiB below a GiB (a short job's "0.00 GiB" said nothing).
std::string MemoryText(int64_t b) {
  return b < (int64_t{1} << 30) ? absl::StrFormat("%.0f MiB", b / 1048576.0)
                                : absl::StrFormat("%.2f GiB", b / 1073741824.0);
}

// How the span's processes started, after its start figure: " (forked)", " (2 forked, 1 cold)".
std::string StartedText(const RestartCost& c) {
  const std::pair<int, const char*> kinds[] = {
      {c.started_forked, "forked"}, {c.started_spare, "spare"}, {c.started_cold, "cold"}};
  std::vector<std::string> parts;
  int kinds_seen = 0;
  for (const auto& [n, name] : kinds) kinds_seen += n > 0;
  for (const auto& [n, name] : kinds) {
    if (n > 0) parts.push_back(kinds_seen == 1 ? name : absl::StrCat(n, " ", name));
  }
  return parts.empty() ? "" : absl::StrCat(" (", absl::StrJoin(parts, ", "), ")");
}

// An in-process recovery's line (or a node admitted's). In-process recoveries restart nothing:
// the survivors kept running (docs/RECOVERY.md). A node admitted into the running group costs
// the same phases, and is no fault. Without a step record before the fault there is no step to
// name, and the span ran to the recovery's end (RestartLedger::RecoveryDone).
std::string InProcessLine(const RestartCost& c) {
  const std::string when = c.fault_step >= 0 ? absl::StrCat("after step ", c.fault_step)
                                             : std::string("before any step record");
  std::string out = absl::StrFormat(
      "\n  %s %s: %.2f s lost (on %s): detection %.2f, start %.2f%s, "
      "state from peer %.2f, %d step(s) recomputed %.2f",
      c.admission ? "a node admitted" : "in-process recovery", when, c.total_s(), c.host,
      c.detection_s, c.start_s, StartedText(c), c.state_from_peer_s, c.recomputed_steps,
      c.recomputed_s);
  if (c.recoveries() > 1) absl::StrAppend(&out, " over ", c.recoveries(), " in-process recoveries");
  if (!c.resumed) {
    absl::StrAppend(&out, " (so far)");
  } else if (c.fault_step < 0) {
    absl::StrAppend(&out, " (no step records: counted up to the recovery's end)");
  }
  return out;
}

// Restart `i`'s line: its cause and, where measured (`c`), what it cost by phase.
std::string RestartLine(int i, std::string cause, const RestartCost* c) {
  if (cause.empty() && c != nullptr) cause = c->cause;  // a node's own report
  std::string out =
      absl::StrCat("\n  restart ", i, ": ", cause.empty() ? "(cause not recorded)" : cause);
  if (c == nullptr) return out;
  absl::StrAppend(
      &out, absl::StrFormat(
                "; %.2f s lost (on %s): detection %.2f, stop %.2f, rendezvous %.2f, start %.2f%s, "
                "checkpoint load %.2f, %d step(s) recomputed %.2f",
                c->total_s(), c->host, c->detection_s, c->stop_s, c->rendezvous_s, c->start_s,
                StartedText(*c), c->checkpoint_load_s, c->recomputed_steps, c->recomputed_s));
  if (c->resumed_step >= 0) absl::StrAppend(&out, " (resumed from step ", c->resumed_step, ")");
  // The span's faults less the in-process recoveries tried in it: the restarts themselves.
  if (c->group_restarts() > 1) absl::StrAppend(&out, " over ", c->group_restarts(), " restarts");
  if (c->in_process_tries > 0) {
    // Tried first in the span (the state may have arrived: that transfer is in the total).
    absl::StrAppend(&out, ", after ",
                    c->in_process_tries == 1
                        ? "an in-process recovery"
                        : absl::StrCat(c->in_process_tries, " in-process recoveries"),
                    c->fault_step >= 0 ? absl::StrCat(" that did not get past step ", c->fault_step)
                                       : std::string(" that did not finish"));
    if (c->state_from_peer_s > 0) {
      absl::StrAppend(&out, absl::StrFormat(" (state from peer %.2f)", c->state_from_peer_s));
    }
  }
  if (!c->resumed) {
    absl::StrAppend(&out, c->fault_step >= 0
                              ? absl::StrCat("; not yet past step ", c->fault_step, " (so far)")
                              : std::string("; no step records: start counted up to the "
                                            "workers' start"));
  }
  return out;
}

// The restarts and in-process recoveries in the order they came: the costs are ordered by
// (restart count, generation), and a restart whose cost no node measured is said by its cause
// where its number falls. At most 5 restarts are said.
std::string RestartLines(const JobTelemetry::Snapshot& s) {
  std::map<int, const RestartCost*> cost;
  for (const RestartCost& c : s.restart_costs) {
    if (!c.in_process) cost[c.restart] = &c;
  }
  const int n = std::max<int>(static_cast<int>(s.restart_causes.size()),
                              cost.empty() ? 0 : cost.rbegin()->first);
  std::string out;
  int next = 1, shown = 0;
  auto restarts_up_to = [&](int last) {  // restarts next..last, those with a cause or a cost
    for (; next <= std::min(last, n); ++next) {
      const std::string cause = next <= static_cast<int>(s.restart_causes.size())
                                    ? s.restart_causes[next - 1]
                                    : std::string();
      auto it = cost.find(next);
      if (cause.empty() && it == cost.end()) continue;
      if (shown++ < 5)
        absl::StrAppend(&out, RestartLine(next, cause, it == cost.end() ? nullptr : it->second));
    }
  };
  for (const RestartCost& c : s.restart_costs) {
    restarts_up_to(c.restart);  // an in-process span of restart r's group came after restart r
    if (c.in_process) absl::StrAppend(&out, InProcessLine(c));
  }
  restarts_up_to(n);
  return out;
}

std::string RankLine(int rank, const RankTelemetry& r) {
  std::string line =
      r.steps == 0 ? absl::StrFormat("\n  rank %d (%s): no step records", rank, r.host)
                   : absl::StrFormat("\n  rank %d (%s): %d steps, step time p50 %.3f s, p95 %.3f s",
                                     rank, r.host, r.steps, r.step_p50_s, r.step_p95_s);
  if (r.has_data && r.step_s > 0) {
    absl::StrAppend(&line, absl::StrFormat(", data wait %.0f%%", 100 * r.data_s / r.step_s));
  }
  if (r.has_split && r.steps > 0) {
    absl::StrAppend(&line, absl::StrFormat(", compute %.3f s + sync wait %.3f s per step",
                                           r.compute_s / static_cast<double>(r.steps),
                                           r.sync_s / static_cast<double>(r.steps)));
  }
  if (r.cpu_utilization) {
    absl::StrAppend(&line, absl::StrFormat(", CPU %.0f%%", 100 * *r.cpu_utilization));
  }
  if (r.rss_peak_bytes > 0) absl::StrAppend(&line, ", peak RSS ", MemoryText(r.rss_peak_bytes));
  return line;
}

// The words of the advice: train_unet's own flags for train_unet, PyTorch's for the rest.
struct Knobs {
  const char* loader;    // more data-loading parallelism
  const char* cpus;      // more CPUs to run it
  const char* batch;     // a larger batch per GPU
  const char* memory;    // less memory
};
Knobs KnobsFor(const std::string& program) {
  if (program == "train_unet") {
    return {"more loader threads (--num-data-workers) and a deeper queue (--prefetch-factor)",
            "the CPUs to run them (Slurm: --cpus-per-task; Run:ai: --cpu, 8 to 24 per GPU)",
            "a larger --local-batch-size (the largest that fits in GPU memory)",
            "a smaller --local-batch-size with --accumulation-steps, --checkpoint-activations, "
            "or fewer --num-data-workers"};
  }
  return {"more DataLoader workers (num_workers), with pin_memory=True, persistent_workers=True "
          "and prefetch_factor=4",
          "the CPUs to run them (Slurm: --cpus-per-task; Run:ai: --cpu, 8 to 24 per GPU)",
          "a larger batch per GPU (the largest that fits in GPU memory)",
          "smaller batches with gradient accumulation, activation checkpointing, mixed precision, "
          "or fewer DataLoader workers"};
}

// The workers' start cost the most: by how the restarted processes started (forked, promoted
// spares, cold), else by whether warm spares were on.
std::string StartAdvice(const JobTelemetry::Snapshot& s) {
  int ready = 0, cold = 0;
  for (const RestartCost& c : s.restart_costs) {
    ready += c.started_forked + c.started_spare;
    cold += c.started_cold;
  }
  if (cold > 0) {
    return absl::StrFormat(
        "the workers' start: %d of %d process(es) started cold, importing everything "
        "themselves: a Python program's are forked from the fork server (--fork-server auto, "
        "the default for `python SCRIPT`) or promoted warm spares (--spare-workers on)",
        cold, cold + ready);
  }
  if (ready > 0 || s.warm_spares) {
    return "the workers' start: every process was ready (forked from the fork server or a "
           "promoted spare), so this is the program's own work before its first step (its "
           "process group, the checkpoint, the model, the data loader), slower on a node whose "
           "cores are busy beside the job: make that shorter, or keep other work off the job's "
           "cores";
  }
  return "the workers' start: use warm spares (--spare-workers)";
}

// Restarts that cost more than 10% of the wall time: what to change for the phase that cost the
// most (summed over the restarts); "checkpoint more often" only where recomputing was it.
std::string RestartAdvice(const JobTelemetry::Snapshot& s) {
  std::string head = "restarts cost more than 10% of the wall time";
  if (s.warm_spares) absl::StrAppend(&head, " (warm spares were on)");
  const RestartCost sum = SumOfRestartCosts(s.restart_costs);
  std::string most;
  double most_s = 0;
  for (const auto& [name, secs] : sum.Phases()) {
    if (secs > most_s) {
      most = name;
      most_s = secs;
    }
  }
  if (most.empty()) {  // no phases measured: the general advice
    return absl::StrCat(head, s.warm_spares ? ": checkpoint more often"
                                            : ": checkpoint more often, or use warm spares "
                                              "(--spare-workers)");
  }
  const std::string share =
      absl::StrFormat(", %.0f%% of it (%.1f s) ", 100 * most_s / std::max(most_s, sum.total_s()),
                      most_s);
  if (most == "recomputed") {
    return absl::StrCat(head, share, "recomputing steps done before the fault: checkpoint more "
                                     "often");
  }
  if (most == "start") return absl::StrCat(head, share, StartAdvice(s));
  if (most == "checkpoint_load") {
    return absl::StrCat(head, share, "loading the checkpoint: a smaller checkpoint, or one on a "
                                     "node-local or faster file system");
  }
  if (most == "detection") {
    return absl::StrCat(head, share, "noticing the fault: a lower --hang-timeout, or a shorter "
                                     "timeout for the program's process group");
  }
  if (most == "stop") {
    return absl::StrCat(head, share, "stopping the workers (the stacks captured before the kill "
                                     "included): workers slow to exit on SIGTERM, or "
                                     "--capture-before-kill off");
  }
  if (most == "rendezvous") {
    return absl::StrCat(head, share, "the rendezvous: a shorter last_call_timeout (--rdzv-conf), "
                                     "or every node ready sooner");
  }
  return absl::StrCat(head, share, "the state transfer from a peer: a smaller model state, or a "
                                   "faster network between the nodes");
}

// Advice, from the guides this project grew from (docs/TELEMETRY.md, "Advice"): GPU
// utilisation comes first; low utilisation with ranks waiting for data or with busy CPUs is data
// loading, with idle CPUs it is something else. High GPU memory use is what the guides ask for.
std::vector<std::string> Advice(const JobTelemetry::Snapshot& s, const GpuSummary& g,
                                const CpuSummary& c) {
  double data_max = 0;
  for (const auto& [rank, r] : s.ranks) {
    if (r.has_data && r.step_s > 0) data_max = std::max(data_max, r.data_s / r.step_s);
  }
  const double cpu_busy = c.efficiency();  // -1: unknown
  const Knobs k = KnobsFor(s.program);
  const bool waits = data_max > 0.1;
  const bool busy = cpu_busy >= 0.75;
  std::vector<std::string> advice;
  if (g.mean >= 0 && g.mean < 0.9) {
    std::vector<std::string> why;
    if (waits) why.push_back(absl::StrFormat("ranks wait for data %.0f%% of a step", 100 * data_max));
    if (busy) why.push_back(absl::StrFormat("the CPUs are %.0f%% busy", 100 * cpu_busy));
    if (!why.empty()) {
      advice.push_back(absl::StrFormat(
          "GPU utilization is %.0f%% while %s: data loading holds the GPUs back: %s, and %s",
          100 * g.mean, absl::StrJoin(why, " and "), k.loader, k.cpus));
    } else {
      std::string line = absl::StrFormat(
          "GPU utilization is %.0f%% with little data wait%s: not data loading; look at the "
          "batch per GPU (%s), the gradient sync, and work between the steps",
          100 * g.mean,
          cpu_busy >= 0 ? absl::StrFormat(" and the CPUs %.0f%% busy", 100 * cpu_busy) : "",
          k.batch);
      if (g.mem_total > 0 && g.mem_peak < 0.5 * g.mem_total) {
        absl::StrAppend(&line, absl::StrFormat(" (GPU memory peaked at %.0f%%: room for more)",
                                               100 * g.mem_peak / g.mem_total));
      }
      advice.push_back(line);
    }
  } else if (g.mean < 0 && waits) {  // no GPUs (a CPU job): the data wait alone
    advice.push_back(absl::StrFormat("ranks wait for data %.0f%% of a step: %s%s", 100 * data_max,
                                     k.loader, busy ? absl::StrCat(", and ", k.cpus) : ""));
  }
  for (const auto& m : s.node_memory) {
    if (m.limit_bytes > 0 && m.peak_rss_bytes > 0.9 * static_cast<double>(m.limit_bytes)) {
      advice.push_back(absl::StrFormat(
          "the ranks on %s peaked at %.1f GiB of its %.1f GiB memory limit%s: %s", m.host,
          m.peak_rss_bytes / 1073741824.0, m.limit_bytes / 1073741824.0,
          m.limit_source.empty() ? "" : absl::StrCat(" (", m.limit_source, ")"), k.memory));
    }
  }
  for (const Straggler& st : s.stragglers) {
    advice.push_back(absl::StrFormat("rank %d on %s was a straggler (%s): %s", st.rank, st.host,
                                     st.metric, st.hint));
  }
  if (s.restarts > 0 && s.lost_s > 0.1 * s.wall_s) advice.push_back(RestartAdvice(s));
  return advice;
}

// The job's efficiency as seff gives it (CPU against the CPUs allocated, with the per-rank
// figure of one core beside it; memory against the request or limit) and its GPUs' use.
// `cpu_sum` is the ranks' CPU seconds, `cpu_n` the ranks that reported some.
std::string EfficiencyLines(const JobTelemetry::Snapshot& s, const CpuSummary& cpus,
                            const GpuSummary& g, double cpu_sum, int cpu_n) {
  std::string out;
  // As seff: the CPU time over the core-walltime of the CPUs allocated; beside it, per rank.
  const double wall_cpu = s.wall_s * cpu_n;
  if (cpus.efficiency() >= 0) {
    absl::StrAppend(&out, absl::StrFormat("\n  CPU efficiency: %.0f%% of %s CPU(s) allocated (%s) "
                                          "on %d node(s): %.1f CPU-s of %.1f s core-walltime",
                                          100 * cpus.efficiency(), absl::StrFormat("%g", cpus.allocated),
                                          cpus.source, cpus.nodes, cpus.used_s,
                                          cpus.core_walltime_s));
    if (wall_cpu > 0) {
      absl::StrAppend(&out, absl::StrFormat("; per rank %.0f%% of one core", 100 * cpu_sum / wall_cpu));
    }
  } else if (wall_cpu > 0) {
    absl::StrAppend(&out, absl::StrFormat("\n  CPU efficiency: %.0f%% of one core per rank "
                                          "(%.1f CPU-s over %.1f rank-s)",
                                          100 * cpu_sum / wall_cpu, cpu_sum, wall_cpu));
  }
  // dlrun's own cost: its agents' CPU time, a share of the workers' from a CPU-second of theirs.
  if (s.agent_cpu_s > 0 && cpu_sum > 0) {
    absl::StrAppend(&out, absl::StrFormat("\n  dlrun's agents: %.2f CPU-s, ", s.agent_cpu_s),
                    cpu_sum >= 1 ? absl::StrFormat("%.2f%% of the workers' %.1f CPU-s",
                                                   100 * s.agent_cpu_s / cpu_sum, cpu_sum)
                                 : absl::StrFormat("the workers' %.2f CPU-s", cpu_sum));
  }
  // As seff's memory efficiency: the node's ranks' peaks against the request or limit.
  for (const auto& m : s.node_memory) {
    if (m.limit_bytes <= 0 || m.peak_rss_bytes <= 0) continue;
    absl::StrAppend(&out, absl::StrFormat("\n  memory on %s: peak %s of %s (%s), %.0f%%", m.host,
                                          MemoryText(m.peak_rss_bytes), MemoryText(m.limit_bytes),
                                          m.limit_source.empty() ? "limit" : m.limit_source,
                                          100.0 * m.peak_rss_bytes / m.limit_bytes));
    if (m.spare_rss_bytes > 0) {  // memory the ranks' peak leaves out, held all the same
      absl::StrAppend(&out, absl::StrFormat(", and %s more for ready processes (the fork "
                                            "server, warm spares: their share of anonymous memory)",
                                            MemoryText(m.spare_rss_bytes)));
    }
  }
  if (!s.gpus.empty()) {
    absl::StrAppend(&out, absl::StrFormat("\n  GPU utilization: mean %.0f%%, min %.0f%% over %d "
                                          "GPU(s); peak memory %.1f of %.1f GiB",
                                          100 * g.mean, 100 * g.min,
                                          static_cast<int>(s.gpus.size()), g.mem_peak / 1073741824.0,
                                          g.mem_total / 1073741824.0));
    // The DGX guide's figure: the same work on fewer GPUs, each busier.
    if (g.mean < 0.9 && g.NeededAt90() < g.count) {
      absl::StrAppend(&out, absl::StrFormat("\n  this work would need %d GPU(s) at 90%% "
                                            "utilization instead of %d at %.0f%%",
                                            g.NeededAt90(), g.count, 100 * g.mean));
    }
  }
  return out;
}

}  // namespace

std::string ProfileText(const RankProfile& p, absl::string_view indent) {
  std::string out = absl::StrCat(indent, "profile of rank ", p.rank, " (", p.tool, " on ", p.host,
                                 "): ", p.path.empty() ? "none" : p.path);
  if (!p.note.empty()) absl::StrAppend(&out, " (", p.note, ")");
  std::vector<std::string> hot;
  for (const auto& [frame, fraction] : p.hot) {
    if (hot.size() < 3) hot.push_back(absl::StrFormat("%.0f%% in %s", 100 * fraction, frame));
  }
  if (hot.empty()) return out;
  // The shares with what they are of: 50% of 4 samples is not 50% of 4,000.
  absl::StrAppend(&out, "\n", indent, "  rank ", p.rank,
                  p.samples > 0 ? absl::StrCat(" (", p.samples, " samples)") : std::string(),
                  ": ", absl::StrJoin(hot, "; "));
  if (p.samples > 0 && p.samples < kProfileFewSamples) {
    absl::StrAppend(&out, " (few samples: the shares are rough; profile more steps or longer)");
  }
  return out;
}

std::string FormatJobReport(const JobTelemetry::Snapshot& s, int exit_code) {
  int64_t steps = 0, samples = 0;
  for (const auto& [rank, r] : s.ranks) {
    steps += r.steps;
    samples += r.samples;
  }
  const int world = s.world_size > 0 ? s.world_size : static_cast<int>(s.ranks.size());
  const int nodes = std::max(1, s.nodes);
  std::string shape = absl::StrFormat("%d rank(s) on %d node(s)", world, nodes);
  if (s.max_world_size > world || s.max_nodes > nodes) {
    absl::StrAppend(&shape, absl::StrFormat(" (at most %d on %d)", std::max(world, s.max_world_size),
                                            std::max(nodes, s.max_nodes)));
  }
  // In-process recoveries restart nothing, but cost time too: counted beside the restarts.
  int recoveries = 0;
  for (const RestartCost& c : s.restart_costs) {
    if (!c.admission) recoveries += c.recoveries();
  }
  const std::string also =
      recoveries == 0
          ? ""
          : absl::StrFormat(", %d in-process recover%s", recoveries, recoveries == 1 ? "y" : "ies");
  std::string out = absl::StrFormat(
      "job report: %s after %.1f s wall (%.1f s lost to %d restart(s)%s and rendezvous), %s, ",
      exit_code == 0 ? "succeeded" : absl::StrCat("failed (exit ", exit_code, ")"), s.wall_s,
      s.lost_s, s.restarts, also, shape);
  if (steps == 0) {
    absl::StrAppend(&out, "no step records (Python: dlrun_report.report_step, C++: "
                          "dlrun::worker; docs/TELEMETRY.md)");
  } else {
    // Two rates: the ranks' own step times leave out start-up, data set-up and anything
    // between the steps that a program does not time; the wall clock includes them.
    absl::StrAppend(&out, absl::StrFormat("%.2f samples/s over the ranks' step times (%.2f "
                                          "over the wall clock)",
                                          s.samples_per_sec,
                                          s.wall_s > 0 ? static_cast<double>(samples) / s.wall_s
                                                       : 0.0));
  }
  if (steps > 0 && s.wall_s > 0) {
    absl::StrAppend(&out, absl::StrFormat("\n  goodput %.0f%%: %.1f s of the %.1f s wall in steps "
                                          "that were kept",
                                          100 * std::min(1.0, s.productive_s / s.wall_s),
                                          s.productive_s, s.wall_s));
    if (!s.restart_costs.empty()) {
      absl::StrAppend(&out, absl::StrFormat("; %.1f s lost to restarts%s", s.lost_s,
                                            recoveries == 0 ? "" : " and recoveries"));
    }
  }
  absl::StrAppend(&out, RestartLines(s));
  double cpu_sum = 0;
  int cpu_n = 0;
  for (const auto& [rank, r] : s.ranks) {
    absl::StrAppend(&out, RankLine(rank, r));
    if (r.cpu_s > 0) {
      cpu_sum += r.cpu_s;
      ++cpu_n;
    }
  }
  double slowest = -1;
  std::string slowest_what;
  const int slowest_rank = SlowestRank(s.ranks, &slowest, &slowest_what);
  if (slowest_rank >= 0 && s.ranks.size() > 1) {
    absl::StrAppend(&out, absl::StrFormat("\n  slowest rank: %d (%s %.3f s)", slowest_rank,
                                          slowest_what, slowest));
  }
  const CpuSummary cpus = SummariseCpus(s);
  const GpuSummary g = SummariseGpus(s.gpus);
  absl::StrAppend(&out, EfficiencyLines(s, cpus, g, cpu_sum, cpu_n));
  for (const auto& [rank, p] : s.profiles) absl::StrAppend(&out, "\n", ProfileText(p, "  "));
  for (const std::string& a : Advice(s, g, cpus)) absl::StrAppend(&out, "\n  advice: ", a);
  return out;
}

}  // namespace dlrun::telemetry
