#include "launcher/workers/spawn_spec.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/contract.h"
#include "common/host_port.h"
#include "launcher/workers/worker_env.h"

namespace dlrun::launcher {

std::string ConsolePrefix(const AgentOptions& options, const Assignment& current, int rank,
                          int local_rank) {
  if (options.console_prefix_template.empty()) return absl::StrCat("[rank ", rank, "]: ");
  return absl::StrReplaceAll(options.console_prefix_template,
                             {{"${role_name}", current.role},
                              {"${local_rank}", absl::StrCat(local_rank)},
                              {"${rank}", absl::StrCat(rank)},
                              {"${hostname}", options.hostname}});
}

SpawnSpec MakeSpawnSpec(const AgentOptions& options, const std::vector<std::string>& spare_argv,
                        const Assignment& current, const RunDir& run_dir, int attempt, int lr) {
  SpawnSpec spec;
  spec.local_rank = lr;
  spec.argv = options.argv;
  spec.spare_argv = spare_argv;
  spec.fork_server_argv = options.fork_server_argv;
  const std::string err = run_dir.FreshErrorFile(attempt, lr);
  spec.env = BuildWorkerEnv(current, lr, err, options.omp_threads, options.virtual_local_rank);
  for (const auto& [k, v] : options.extra_env) spec.env[k] = v;
  for (const std::string& k : options.keep_inherited) {
    spec.env.erase(k);
    if (k == contract::kNcclAsyncErrorHandling || k == contract::kNcclAsyncErrorHandlingOld) {
      spec.env.erase(contract::kNcclErrorHandlingDefault);  // the user's setting, not dlrun's
    }
  }
  if (lr < static_cast<int>(options.gpus.size())) {
    spec.env[contract::kCudaVisibleDevices] = options.gpus[lr];
  }
  if (lr < static_cast<int>(options.worker_cpus.size())) spec.cpus = options.worker_cpus[lr];
  if (std::getenv(contract::kPythonFaultHandler) == nullptr) {
    spec.env.try_emplace(contract::kPythonFaultHandler, "1");  // a crash's faulting frame
  }
  const int rank = current.rank_offset + lr;
  if (options.profiler && options.profiler->Wants(rank)) {
    std::vector<std::string> argv = options.profiler->Argv(rank, spec.argv);
    if (argv != spec.argv) {  // a spare and a fork run the plain command
      spec.spare_argv.clear();
      spec.fork_server_argv.clear();
    }
    spec.argv = std::move(argv);
    for (auto& [k, v] : options.profiler->Env(rank)) spec.env[k] = v;
  }
  spec.console_prefix = ConsolePrefix(options, current, rank, lr);
  const int mode = lr < static_cast<int>(options.redirects.size()) ? options.redirects[lr] : 0;
  const auto& shown_ranks = options.console_ranks;
  const bool shown = shown_ranks.empty() ||
                     std::find(shown_ranks.begin(), shown_ranks.end(), lr) != shown_ranks.end();
  spec.out.console_fd = shown && !(mode & 1) ? STDOUT_FILENO : -1;
  spec.stdout_pty = options.stdout_pty && spec.out.console_fd >= 0;
  spec.err.console_fd = shown && !(mode & 2) ? STDERR_FILENO : -1;
  if (!options.log_dir.empty()) {
    // The Flight Recorder's dumps (NCCL's on a collective timeout, Gloo's through dlrun_report)
    // in the attempt's directory, for AfterFailure; a user's own settings win.
    const std::string fr = run_dir.MakeFlightRecorderDir(attempt);
    auto unless_set = [&spec](std::initializer_list<const char*> names, const std::string& v) {
      for (const char* n : names) {
        if (std::getenv(n) != nullptr) return;
      }
      spec.env[*names.begin()] = v;
    };
    // torch >= 2.8's names only: it warns on every rank about the older TORCH_NCCL_ ones.
    unless_set({contract::kFrBufferSize, contract::kNcclTraceBufferSize}, "2000");
    unless_set({contract::kFrDumpOnTimeout, contract::kNcclDumpOnTimeout}, "1");
    unless_set({contract::kFrDumpTempFile, contract::kNcclDebugInfoTempFile},
               absl::StrCat(fr, "/", contract::kFrFilePrefix));
    const std::string dir = run_dir.WorkerLogDir(attempt, lr);
    spec.out.log_path = dir + "/stdout.log";
    spec.err.log_path = dir + "/stderr.log";
  }
  return spec;
}

std::string GroupTable(const Assignment& a, const std::vector<DumpTarget>& workers,
                       const RestartPhases& phases) {
  std::string table = absl::StrCat("restart ", a.restart_count, ": node ", a.node_rank, " of ",
                                   a.num_nodes, ", world size ", a.world_size, ", master ",
                                   JoinHostPort(a.master_addr, a.master_port));
  // `dlrun stacks --run-id` and `dlrun profile --run-id` name the job by it.
  if (!a.run_id.empty()) absl::StrAppend(&table, ", run id ", a.run_id);
  if (phases.fault_seen && phases.stopped) {
    auto ms = [](SteadyTime from, SteadyTime to) {
      return std::chrono::duration_cast<Millis>(to - from).count();
    };
    absl::StrAppend(&table, " (after the fault: stop ", ms(*phases.fault_seen, *phases.stopped),
                    " ms, rendezvous ", ms(*phases.stopped, phases.assigned), " ms, spawn ",
                    ms(phases.assigned, phases.spawned), " ms)");
  }
  absl::StrAppend(&table, "\n  local_rank  rank  pid");
  for (const DumpTarget& w : workers) {
    absl::StrAppend(&table, "\n  ",
                    absl::StrFormat("%-10d  %-4d  %d", w.local_rank, w.rank, w.pid));
  }
  return table;
}

}  // namespace dlrun::launcher
