#include "launcher/app/plan.h"

#include <signal.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

absl::StatusOr<std::vector<std::string>> ResolveGpus(const std::string& spec, int nproc,
                                                     const GpuFacts& facts) {
  std::vector<std::string> ids;
  if (spec == "none") return ids;
  if (spec == "auto") {
    if (facts.visible_devices.has_value()) {
      ids = absl::StrSplit(*facts.visible_devices, ',', absl::SkipEmpty());  // the scheduler's
    } else if (facts.loads && static_cast<int>(facts.loads->size()) >= nproc) {
      for (int i : PickLeastLoaded(*facts.loads, nproc)) ids.push_back(std::to_string(i));
      spdlog::info("--gpus auto: the {} least-loaded GPU(s) by memory used and utilisation: {}",
                   nproc, absl::StrJoin(ids, ","));
    } else {
      for (int i = 0; i < facts.device_count; ++i) ids.push_back(std::to_string(i));
    }
    if (static_cast<int>(ids.size()) < nproc) return std::vector<std::string>{};  // CPU run
  } else {
    ids = absl::StrSplit(spec, ',', absl::SkipEmpty());
    if (static_cast<int>(ids.size()) < nproc) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid value '", spec, "' for --gpus: expected at least ", nproc,
          " device ids (one per worker), auto or none"));
    }
  }
  ids.resize(nproc);
  return ids;
}

std::vector<std::string> WorkerArgv(const LaunchOptions& o) {
  std::vector<std::string> argv;
  if (o.module) {
    argv = {"python3", "-m"};
  } else if (!o.no_python && absl::EndsWith(o.command[0], ".py")) {
    argv = {"python3", "-u"};
  }
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

int OmpThreads(bool user_set, int ncpus, int nproc) {
  if (user_set) return 0;
  return std::max(1, ncpus / std::max(1, nproc));
}

void SplitSignals(const std::vector<int>& handled, AgentOptions* a) {
  for (int sig : handled) {
    (sig == SIGUSR1 || sig == SIGUSR2 ? a->passthrough_signals : a->forwarded_signals)
        .push_back(sig);
  }
}

std::string RunDir(const std::string& tmpdir, unsigned uid, const std::string& run_id, int pid) {
  return absl::StrCat(tmpdir.empty() ? "/tmp" : tmpdir, "/dlrun-", uid, "/", run_id, "-", pid);
}

Assignment StaticAssignment(const LaunchOptions& o, int nproc) {
  Assignment a;
  a.node_rank = o.node_rank;
  a.num_nodes = o.max_nodes;
  a.local_world_size = nproc;
  a.world_size = o.max_nodes * nproc;
  a.rank_offset = o.node_rank * nproc;
  a.role = o.role;
  a.master_addr = o.master_addr;
  a.master_port = o.master_port;
  a.run_id = o.rdzv_id;
  a.max_restarts = o.max_restarts;
  return a;
}

}  // namespace dlrun::launcher
