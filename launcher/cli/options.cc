#include "launcher/cli/options.h"

#include <signal.h>

#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "launcher/cli/flags.h"

namespace dlrun::launcher {
namespace {

using cli::BadValue;
using Flag = cli::Flag<LaunchOptions>;
using O = LaunchOptions;

absl::Status CheckStd(const std::string& flag, const std::string& v) {
  // torchrun's redirects/tee: a single 0-3 for all ranks, or "local_rank:0-3,..." per rank.
  const std::string expected = "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or RANK:0-3,...";
  int x = 0;
  if (absl::SimpleAtoi(v, &x)) return (x >= 0 && x <= 3) ? absl::OkStatus() : BadValue(flag, v, expected);
  for (absl::string_view item : absl::StrSplit(v, ',')) {
    std::vector<std::string> kv = absl::StrSplit(item, ':');
    int r = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &r) || r < 0 || !absl::SimpleAtoi(kv[1], &x) ||
        x < 0 || x > 3) {
      return BadValue(flag, v, expected);
    }
  }
  return absl::OkStatus();
}

cli::Setter<O> StdField(const std::string& flag, std::string O::*field) {
  return [=](O& o, const std::string& v) {
    auto s = CheckStd(flag, v);
    if (s.ok()) o.*field = v;
    return s;
  };
}

absl::Status SetNnodes(O& o, const std::string& v) {
  auto r = cli::ParseNodeRange("nnodes", v);
  if (!r.ok()) return r.status();
  o.min_nodes = r->min;
  o.max_nodes = r->max;
  return absl::OkStatus();
}

absl::Status SetNproc(O& o, const std::string& v) {
  if (v != "auto" && v != "gpu" && v != "cpu") {
    auto n = ResolveNprocPerNode(v, 0, 1);
    if (!n.ok()) return n.status();
  }
  o.nproc_per_node = v;
  return absl::OkStatus();
}

absl::Status SetBackend(O& o, const std::string& v) {
  if (v != "static" && v != "c10d" && v != "grpc" && v != "dlrun" && v != "etcd" &&
      v != "etcd-v2") {
    return BadValue("rdzv-backend", v, "static, c10d, grpc or dlrun");
  }
  o.rdzv_backend = v;
  return absl::OkStatus();
}

absl::Status SetMasterPort(O& o, const std::string& v) {
  auto n = cli::ParseInt("master-port", v, 0, 65535);
  if (!n.ok()) return BadValue("master-port", v, "a port number 0-65535");
  o.master_port = *n;
  o.master_port_given = true;
  return absl::OkStatus();
}

absl::Status SetSignals(O& o, const std::string& v) {
  auto s = cli::ParseSignalList("signals-to-handle", v);
  if (!s.ok()) return s.status();
  o.signals_to_handle = *s;
  return absl::OkStatus();
}

std::vector<Flag> Flags() {
  using cli::BoolField;
  using cli::DurationField;
  using cli::IntField;
  using cli::StrField;
  constexpr int kMax = std::numeric_limits<int>::max();
  return {
      {"nnodes", "", true, SetNnodes, "N or MIN:MAX nodes (default 1:1)"},
      {"nproc-per-node", "", true, SetNproc, "workers per node: auto | gpu | cpu | N (default 1)"},
      {"standalone", "", false, BoolField(&O::standalone),
       "single node, local rendezvous on a free port"},
      {"rdzv-backend", "", true, SetBackend,
       "static (fixed node ranks) or c10d/grpc (dlrun's gRPC rendezvous)"},
      {"rdzv-endpoint", "", true, StrField(&O::rdzv_endpoint), "HOST[:PORT] of the rendezvous"},
      {"rdzv-id", "", true, StrField(&O::rdzv_id), "run id shared by all nodes of the job"},
      {"rdzv-conf", "", true, StrField(&O::rdzv_conf), "KEY=VALUE,... rendezvous settings"},
      {"max-restarts", "", true, IntField("max-restarts", &O::max_restarts, 0, kMax),
       "restarts of the worker group before the job fails (default 0)"},
      {"monitor-interval", "", true, DurationField("monitor-interval", &O::monitor_interval, true),
       "accepted for torchrun compatibility; dlrun sees worker exits at once"},
      {"role", "", true, StrField(&O::role), "worker role name (default 'default')"},
      {"no-python", "", false, BoolField(&O::no_python),
       "run PROGRAM directly even if it is a .py file"},
      {"module", "m", false, BoolField(&O::module), "run PROGRAM as 'python3 -m PROGRAM'"},
      {"run-path", "", false, BoolField(&O::run_path), "accepted; same as default"},
      {"log-dir", "", true, StrField(&O::log_dir), "directory for per-rank logs"},
      {"redirects", "r", true, StdField("redirects", &O::redirects),
       "redirect worker streams to --log-dir files"},
      {"tee", "t", true, StdField("tee", &O::tee),
       "tee worker streams to --log-dir files and the console"},
      {"local-ranks-filter", "", true, StrField(&O::local_ranks_filter),
       "only show output of these local ranks (e.g. 0,1)"},
      {"node-rank", "", true, IntField("node-rank", &O::node_rank, 0, kMax),
       "rank of this node (static rendezvous)"},
      {"master-addr", "", true, StrField(&O::master_addr), "address of node rank 0 (static)"},
      {"master-port", "", true, SetMasterPort,
       "port of the c10d store on node rank 0 (static; default 29500)"},
      {"local-addr", "", true, StrField(&O::local_addr), "address of this node"},
      {"signals-to-handle", "", true, SetSignals,
       "signals forwarded to workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT; SIGUSR1/SIGUSR2 "
       "are passed on without stopping the job)"},
      {"hang-timeout", "", true, DurationField("hang-timeout", &O::hang_timeout, true),
       "restart workers whose dlrun::worker heartbeats stop this long (0: off)"},
      {"grace-period", "", true, DurationField("grace-period", &O::grace_period, true),
       "seconds between SIGTERM and SIGKILL when stopping workers (default 30)"},
      {"gpus", "", true, StrField(&O::gpus),
       "auto (one visible GPU per worker), none, or device ids 0,1,..."},
  };
}

}  // namespace

absl::StatusOr<int> ResolveNprocPerNode(const std::string& value, int num_gpus, int num_cpus) {
  if (value == "cpu") return num_cpus;
  if (value == "gpu") {
    if (num_gpus <= 0) {
      return absl::FailedPreconditionError(
          "--nproc-per-node gpu: no GPU found on this node (use cpu or a number)");
    }
    return num_gpus;
  }
  if (value == "auto") return num_gpus > 0 ? num_gpus : num_cpus;
  int n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 1 || n > 4096) {
    return BadValue("nproc-per-node", value, "auto, gpu, cpu or an integer 1-4096");
  }
  return n;
}

absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env) {
  LaunchOptions o;
  o.signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  cli::ParseSpec spec{"dlrun", /*wants_program=*/true, /*pet_fallback=*/true};
  auto parsed = cli::ParseFlags(spec, Flags(), args, o, &env);
  if (!parsed.ok()) return parsed.status();
  o.command = std::move(parsed->program);
  o.given = std::move(parsed->given);
  if (o.standalone) {
    o.min_nodes = o.max_nodes = 1;
    o.node_rank = 0;
  }
  if (o.node_rank >= o.max_nodes) {
    return BadValue("node-rank", std::to_string(o.node_rank),
                    absl::StrCat("an integer below --nnodes (", o.max_nodes, ")"));
  }
  return o;
}

std::vector<int> StdSpecPerRank(const std::string& spec, int nproc) {
  std::vector<int> out(nproc, 0);
  int all = 0;
  if (absl::SimpleAtoi(spec, &all)) {
    std::fill(out.begin(), out.end(), all);
    return out;
  }
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::vector<std::string> kv = absl::StrSplit(item, ':');
    int r = 0, v = 0;
    if (kv.size() == 2 && absl::SimpleAtoi(kv[0], &r) && absl::SimpleAtoi(kv[1], &v) && r >= 0 &&
        r < nproc) {
      out[r] = v;
    }
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParseRankList(const std::string& list, int nproc) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int r = 0;
    if (!absl::SimpleAtoi(item, &r) || r < 0 || r >= nproc) {
      return BadValue("local-ranks-filter", list,
                 absl::StrCat("comma-separated local ranks in [0, ", nproc, ")"));
    }
    out.push_back(r);
  }
  return out;
}

std::string UsageText() {
  return cli::Usage(
      "usage: dlrun [options] PROGRAM [ARGS...]\n"
      "       dlrun env [options]       print the detected environment and resulting settings\n"
      "       dlrun rdzv-server [...]   run the rendezvous on its own (--help for its flags)\n"
      "       dlrun slurm [...] -- CMD  write (or --submit) an sbatch script running CMD\n"
      "       dlrun runai [...] -- CMD  print the Run:ai command (-o: manifest) running CMD\n\n"
      "Starts one worker per slot with the torchrun worker environment (RANK, LOCAL_RANK,\n"
      "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). Flags accept '-' or '_' and fall back to\n"
      "PET_<FLAG> environment variables.\n\noptions:\n",
      Flags());
}

}  // namespace dlrun::launcher
