#include "launcher/options.h"

#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dlrun::launcher {
namespace {

using Setter = std::function<absl::Status(LaunchOptions&, const std::string&)>;

struct Flag {
  std::string name;        // canonical, '-' separated, without leading dashes
  std::string short_name;  // e.g. "r", or empty
  bool takes_value;
  Setter set;
  std::string help;
};

absl::Status Bad(const std::string& flag, const std::string& value, const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value '", value, "' for --", flag, ": expected ", expected));
}

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& value, int lo, int hi,
                             const std::string& expected) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) return Bad(flag, value, expected);
  return v;
}

absl::Status ParseNnodes(LaunchOptions& o, const std::string& v) {
  const std::string expected = "N or MIN:MAX with 1 <= MIN <= MAX";
  std::vector<std::string> parts = absl::StrSplit(v, ':');
  int lo = 0, hi = 0;
  if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &lo)) {
    hi = lo;
  } else if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &lo) ||
             !absl::SimpleAtoi(parts[1], &hi)) {
    return Bad("nnodes", v, expected);
  }
  if (lo < 1 || hi < lo) return Bad("nnodes", v, expected);
  o.min_nodes = lo;
  o.max_nodes = hi;
  return absl::OkStatus();
}

absl::Status ParseStd(const std::string& flag, const std::string& v) {
  // torchrun's redirects/tee: a single 0-3 for all ranks, or "local_rank:0-3,..." per rank.
  const std::string expected = "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or RANK:0-3,...";
  int x = 0;
  if (absl::SimpleAtoi(v, &x)) return (x >= 0 && x <= 3) ? absl::OkStatus() : Bad(flag, v, expected);
  for (absl::string_view item : absl::StrSplit(v, ',')) {
    std::vector<std::string> kv = absl::StrSplit(item, ':');
    int r = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &r) || r < 0 || !absl::SimpleAtoi(kv[1], &x) ||
        x < 0 || x > 3) {
      return Bad(flag, v, expected);
    }
  }
  return absl::OkStatus();
}

std::vector<Flag> Flags() {
  auto str = [](std::string LaunchOptions::*field) {
    return [field](LaunchOptions& o, const std::string& v) {
      o.*field = v;
      return absl::OkStatus();
    };
  };
  auto boolean = [](bool LaunchOptions::*field) {
    return [field](LaunchOptions& o, const std::string&) {
      o.*field = true;
      return absl::OkStatus();
    };
  };
  return {
      {"nnodes", "", true, ParseNnodes, "N or MIN:MAX nodes (default 1:1)"},
      {"nproc-per-node", "", true,
       [](LaunchOptions& o, const std::string& v) {
         if (v != "auto" && v != "gpu" && v != "cpu") {
           auto n = ResolveNprocPerNode(v, 0, 1);
           if (!n.ok()) return n.status();
         }
         o.nproc_per_node = v;
         return absl::OkStatus();
       },
       "workers per node: auto | gpu | cpu | N (default 1)"},
      {"standalone", "", false,
       [](LaunchOptions& o, const std::string&) {
         o.standalone = true;
         return absl::OkStatus();
       },
       "single node, local rendezvous on a free port"},
      {"rdzv-backend", "", true,
       [](LaunchOptions& o, const std::string& v) {
         if (v != "static" && v != "c10d" && v != "grpc" && v != "dlrun" && v != "etcd" &&
             v != "etcd-v2") {
           return Bad("rdzv-backend", v, "static, c10d, grpc or dlrun");
         }
         o.rdzv_backend = v;
         return absl::OkStatus();
       },
       "static (fixed node ranks) or c10d/grpc (dlrun's gRPC rendezvous)"},
      {"rdzv-endpoint", "", true, str(&LaunchOptions::rdzv_endpoint), "HOST[:PORT] of the rendezvous"},
      {"rdzv-id", "", true, str(&LaunchOptions::rdzv_id), "run id shared by all nodes of the job"},
      {"rdzv-conf", "", true, str(&LaunchOptions::rdzv_conf), "KEY=VALUE,... rendezvous settings"},
      {"max-restarts", "", true,
       [](LaunchOptions& o, const std::string& v) {
         auto n = ParseInt("max-restarts", v, 0, 1000000, "an integer >= 0");
         if (!n.ok()) return n.status();
         o.max_restarts = *n;
         return absl::OkStatus();
       },
       "restarts of the worker group before the job fails (default 0)"},
      {"monitor-interval", "", true,
       [](LaunchOptions& o, const std::string& v) {
         double d = 0;
         if (!absl::SimpleAtod(v, &d) || d < 0) return Bad("monitor-interval", v, "seconds >= 0");
         o.monitor_interval_s = d;
         return absl::OkStatus();
       },
       "accepted for torchrun compatibility; dlrun sees worker exits at once"},
      {"role", "", true, str(&LaunchOptions::role), "worker role name (default 'default')"},
      {"no-python", "", false, boolean(&LaunchOptions::no_python),
       "run PROGRAM directly even if it is a .py file"},
      {"module", "m", false, boolean(&LaunchOptions::module), "run PROGRAM as 'python3 -m PROGRAM'"},
      {"run-path", "", false, boolean(&LaunchOptions::run_path), "accepted; same as default"},
      {"log-dir", "", true, str(&LaunchOptions::log_dir), "directory for per-rank logs"},
      {"redirects", "r", true,
       [](LaunchOptions& o, const std::string& v) {
         auto s = ParseStd("redirects", v);
         if (s.ok()) o.redirects = v;
         return s;
       },
       "redirect worker streams to --log-dir files"},
      {"tee", "t", true,
       [](LaunchOptions& o, const std::string& v) {
         auto s = ParseStd("tee", v);
         if (s.ok()) o.tee = v;
         return s;
       },
       "tee worker streams to --log-dir files and the console"},
      {"local-ranks-filter", "", true, str(&LaunchOptions::local_ranks_filter),
       "only show output of these local ranks (e.g. 0,1)"},
      {"node-rank", "", true,
       [](LaunchOptions& o, const std::string& v) {
         auto n = ParseInt("node-rank", v, 0, std::numeric_limits<int>::max(), "an integer >= 0");
         if (!n.ok()) return n.status();
         o.node_rank = *n;
         return absl::OkStatus();
       },
       "rank of this node (static rendezvous)"},
      {"master-addr", "", true, str(&LaunchOptions::master_addr), "address of node rank 0 (static)"},
      {"master-port", "", true,
       [](LaunchOptions& o, const std::string& v) {
         auto n = ParseInt("master-port", v, 0, 65535, "a port number 0-65535");
         if (!n.ok()) return n.status();
         o.master_port = *n;
         o.master_port_given = true;
         return absl::OkStatus();
       },
       "port of the c10d store on node rank 0 (static; default 29500)"},
      {"local-addr", "", true, str(&LaunchOptions::local_addr), "address of this node"},
      {"signals-to-handle", "", true, str(&LaunchOptions::signals_to_handle),
       "signals forwarded to workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT; SIGUSR1/SIGUSR2 "
       "are passed on without stopping the job)"},
      {"hang-timeout", "", true,
       [](LaunchOptions& o, const std::string& v) {
         double d = 0;
         if (!absl::SimpleAtod(v, &d) || d < 0) return Bad("hang-timeout", v, "seconds >= 0");
         o.hang_timeout_s = d;
         return absl::OkStatus();
       },
       "restart workers whose dlrun::worker heartbeats stop this long (0: off)"},
      {"grace-period", "", true,
       [](LaunchOptions& o, const std::string& v) {
         double d = 0;
         if (!absl::SimpleAtod(v, &d) || d < 0) return Bad("grace-period", v, "seconds >= 0");
         o.grace_period_s = d;
         return absl::OkStatus();
       },
       "seconds between SIGTERM and SIGKILL when stopping workers (default 30)"},
      {"gpus", "", true, str(&LaunchOptions::gpus),
       "auto (one visible GPU per worker), none, or device ids 0,1,..."},
  };
}

std::string Normalize(const std::string& name) {
  return absl::StrReplaceAll(absl::AsciiStrToLower(name), {{"_", "-"}});
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

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
    return Bad("nproc-per-node", value, "auto, gpu, cpu or an integer 1-4096");
  }
  return n;
}

absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env) {
  const std::vector<Flag> flags = Flags();
  LaunchOptions o;
  std::vector<bool> given(flags.size(), false);

  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;  // PROGRAM
    std::string name, value;
    bool has_value = false;
    if (a[1] == '-') {
      std::string body = a.substr(2);
      size_t eq = body.find('=');
      if (eq != std::string::npos) {
        value = body.substr(eq + 1);
        body = body.substr(0, eq);
        has_value = true;
      }
      name = Normalize(body);
    } else {
      name = a.substr(1);  // single-dash: short flag or torchrun's -m / -r / -t
      if (name.size() > 1 && name != "m") {
        value = name.substr(1);
        name = name.substr(0, 1);
        has_value = true;
      }
    }
    size_t f = 0;
    for (; f < flags.size(); ++f) {
      if (flags[f].name == name || (!flags[f].short_name.empty() && flags[f].short_name == name)) {
        break;
      }
    }
    if (f == flags.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '", a, "' (run 'dlrun --help' for the accepted flags)"));
    }
    if (flags[f].takes_value && !has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", flags[f].name, " needs a value: ", flags[f].help));
      }
      value = args[++i];
    } else if (!flags[f].takes_value && has_value) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", flags[f].name, " takes no value, got '", value, "'"));
    }
    if (absl::Status s = flags[f].set(o, value); !s.ok()) return s;
    given[f] = true;
    o.given.insert(flags[f].name);
  }
  o.command.assign(args.begin() + static_cast<long>(i), args.end());

  // PET_* fallbacks for flags not on the command line (Kubeflow / Run:ai set these).
  for (size_t f = 0; f < flags.size(); ++f) {
    if (given[f]) continue;
    std::string var = absl::StrCat(
        "PET_", absl::AsciiStrToUpper(absl::StrReplaceAll(flags[f].name, {{"-", "_"}})));
    std::optional<std::string> v = env(var);
    if (!v.has_value()) continue;
    if (!flags[f].takes_value) {
      const std::string lower = absl::AsciiStrToLower(*v);
      if (lower == "0" || lower == "false" || lower.empty()) continue;
    }
    if (absl::Status s = flags[f].set(o, *v); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(s.message(), " (from ", var, ")"));
    }
    o.given.insert(flags[f].name);
  }

  if (o.command.empty()) {
    return absl::InvalidArgumentError(
        "missing the program to run: usage is dlrun [options] PROGRAM [ARGS...]");
  }
  if (o.standalone) {
    o.min_nodes = o.max_nodes = 1;
    o.node_rank = 0;
  }
  if (o.node_rank >= o.max_nodes) {
    return Bad("node-rank", std::to_string(o.node_rank),
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
      return Bad("local-ranks-filter", list,
                 absl::StrCat("comma-separated local ranks in [0, ", nproc, ")"));
    }
    out.push_back(r);
  }
  return out;
}

std::string UsageText() {
  std::string s =
      "usage: dlrun [options] PROGRAM [ARGS...]\n"
      "       dlrun env [options]       print the detected environment and resulting settings\n"
      "       dlrun rdzv-server [...]   run the rendezvous on its own (--help for its flags)\n"
      "       dlrun slurm [...] -- CMD  write (or --submit) an sbatch script running CMD\n"
      "       dlrun runai [...] -- CMD  print the Run:ai command (-o: manifest) running CMD\n\n"
      "Starts one worker per slot with the torchrun worker environment (RANK, LOCAL_RANK,\n"
      "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). Flags accept '-' or '_' and fall back to\n"
      "PET_<FLAG> environment variables.\n\noptions:\n";
  for (const Flag& f : Flags()) {
    std::string lhs = absl::StrCat("  --", f.name, f.takes_value ? " VALUE" : "");
    if (!f.short_name.empty()) lhs = absl::StrCat("  -", f.short_name, ", ", lhs.substr(2));
    if (lhs.size() < 30) lhs.resize(30, ' ');
    absl::StrAppend(&s, lhs, " ", f.help, "\n");
  }
  return s;
}

}  // namespace dlrun::launcher
