#include "launcher/job_script.h"

#include <functional>
#include <map>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace dlrun::launcher {
namespace {

template <typename Opts>
struct SubFlag {
  std::string name;
  bool takes_value;
  std::function<absl::Status(Opts&, const std::string&)> set;
  std::string help;
};

absl::Status BadValue(const std::string& flag, const std::string& value,
                      const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value '", value, "' for --", flag, ": expected ", expected));
}

template <typename Opts>
std::function<absl::Status(Opts&, const std::string&)> IntField(const std::string& flag,
                                                                int Opts::*field, int lo, int hi) {
  return [=](Opts& o, const std::string& v) {
    int x = 0;
    if (!absl::SimpleAtoi(v, &x) || x < lo || x > hi) {
      return BadValue(flag, v, absl::StrCat("an integer from ", lo, " to ", hi));
    }
    o.*field = x;
    return absl::OkStatus();
  };
}

template <typename Opts>
std::function<absl::Status(Opts&, const std::string&)> StrField(std::string Opts::*field) {
  return [=](Opts& o, const std::string& v) {
    o.*field = v;
    return absl::OkStatus();
  };
}

template <typename Opts>
std::function<absl::Status(Opts&, const std::string&)> BoolField(bool Opts::*field) {
  return [=](Opts& o, const std::string&) {
    o.*field = true;
    return absl::OkStatus();
  };
}

// A value that goes into an #SBATCH line or a YAML scalar: printable, no spaces or quotes.
absl::Status PlainWord(const std::string& flag, const std::string& v) {
  if (v.empty()) return BadValue(flag, v, "a non-empty value");
  for (unsigned char c : v) {
    if (c <= ' ' || c >= 0x7f || c == '"' || c == '\'' || c == '\\' || c == '#' || c == '`' ||
        c == '$') {
      return BadValue(flag, v, "a single word without spaces, quotes, '#', '$' or '\\'");
    }
  }
  return absl::OkStatus();
}

template <typename Opts>
std::function<absl::Status(Opts&, const std::string&)> WordField(const std::string& flag,
                                                                 std::string Opts::*field) {
  return [=](Opts& o, const std::string& v) {
    if (absl::Status s = PlainWord(flag, v); !s.ok()) return s;
    o.*field = v;
    return absl::OkStatus();
  };
}

// `--flag value`, `--flag=value`, '-' or '_' between words, then "--" or the first non-flag
// starts PROGRAM ARGS.
template <typename Opts>
absl::Status ParseSub(const std::string& sub, const std::vector<SubFlag<Opts>>& flags,
                      const std::vector<std::string>& args, Opts& o,
                      std::vector<std::string>* command) {
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (!absl::StartsWith(a, "-") || a == "-") break;
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    absl::StrReplaceAll({{"_", "-"}}, &name);
    const SubFlag<Opts>* f = nullptr;
    for (const auto& c : flags) {
      if (c.name == name) f = &c;
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown option '", args[i], "' for dlrun ", sub, " (see dlrun ", sub, " --help)"));
    }
    if (f->takes_value && !value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("option --", name, " needs a value"));
      }
      value = args[++i];
    } else if (!f->takes_value && value) {
      return absl::InvalidArgumentError(absl::StrCat("option --", name, " takes no value"));
    }
    if (absl::Status s = f->set(o, value.value_or("")); !s.ok()) return s;
  }
  command->assign(args.begin() + static_cast<long>(i), args.end());
  if (command->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dlrun ", sub, ": no program given: expected 'dlrun ", sub, " [options] -- PROGRAM ARGS'"));
  }
  return absl::OkStatus();
}

template <typename Opts>
std::string Usage(const std::string& head, const std::vector<SubFlag<Opts>>& flags) {
  std::string s = head;
  for (const auto& f : flags) {
    std::string left = absl::StrCat("  --", f.name, f.takes_value ? " VALUE" : "");
    absl::StrAppend(&s, left, std::string(left.size() < 30 ? 30 - left.size() : 1, ' '), f.help,
                    "\n");
  }
  return s;
}

std::vector<SubFlag<SlurmJobOptions>> SlurmFlags() {
  using O = SlurmJobOptions;
  auto time = [](O& o, const std::string& v) {
    // sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    bool ok = !v.empty() && v.size() < 16;
    for (char c : v) ok = ok && (absl::ascii_isdigit(c) || c == ':' || c == '-');
    if (!ok || !absl::ascii_isdigit(v.front()) || !absl::ascii_isdigit(v.back())) {
      return BadValue("time", v, "a Slurm time limit such as 30, 04:00:00 or 1-12:00:00");
    }
    o.time = v;
    return absl::OkStatus();
  };
  auto extra = [](O& o, const std::string& v) {
    if (!absl::StartsWith(v, "--") || v.find('\n') != std::string::npos) {
      return BadValue("sbatch-option", v, "one sbatch option such as --mail-type=END");
    }
    o.sbatch_options.push_back(v);
    return absl::OkStatus();
  };
  auto tls_dir = [](O& o, const std::string& v) {
    if (v.empty() || v.find_first_of("\n\r") != std::string::npos) {
      return BadValue("tls-dir", v, "a directory path that every node of the job can read");
    }
    o.tls_dir = v;
    o.tls = true;
    return absl::OkStatus();
  };
  auto hang = [](O& o, const std::string& v) {
    double d = 0;
    if (!absl::SimpleAtod(v, &d) || d < 0) return BadValue("hang-timeout", v, "seconds >= 0");
    o.hang_timeout_s = d;
    return absl::OkStatus();
  };
  return {
      {"nodes", true, IntField<O>("nodes", &O::nodes, 1, 100000), "nodes (sbatch -N; default 1)"},
      {"gpus-per-node", true, IntField<O>("gpus-per-node", &O::gpus_per_node, 0, 64),
       "GPUs per node (default 0: CPU workers)"},
      {"nproc-per-node", true, IntField<O>("nproc-per-node", &O::nproc_per_node, 1, 1024),
       "workers per node (default: one per GPU, 1 without GPUs)"},
      {"cpus-per-task", true, IntField<O>("cpus-per-task", &O::cpus_per_task, 1, 100000),
       "CPUs for each node's agent and its workers (default 8 per GPU; 1 per worker on CPU)"},
      {"time", true, time, "time limit (default 01:00:00)"},
      {"job-name", true, WordField<O>("job-name", &O::job_name), "job name (default dlrun)"},
      {"partition", true, WordField<O>("partition", &O::partition), "partition (sbatch -p)"},
      {"account", true, WordField<O>("account", &O::account), "account (sbatch -A)"},
      {"constraint", true, WordField<O>("constraint", &O::constraint), "node features (sbatch -C)"},
      {"qos", true, WordField<O>("qos", &O::qos), "quality of service"},
      {"mem", true, WordField<O>("mem", &O::mem), "memory per node, e.g. 64G"},
      {"output", true, WordField<O>("output", &O::output), "output file pattern (default dlrun-%j.out)"},
      {"sbatch-option", true, extra, "one more #SBATCH line, e.g. --mail-type=END (repeatable)"},
      {"preemptible", false, BoolField<O>(&O::preemptible),
       "SIGUSR1 before the end -> checkpoint, requeue, resume (--signal, --requeue)"},
      {"signal-seconds", true, IntField<O>("signal-seconds", &O::signal_seconds, 1, 65535),
       "with --preemptible: seconds of warning before the end (default 90)"},
      {"rdzv-port", true, IntField<O>("rdzv-port", &O::rdzv_port, 1, 65535),
       "rendezvous port on the first node (default: 20000 + job id % 10000)"},
      {"tls", false, BoolField<O>(&O::tls),
       "mutual TLS for the rendezvous: the script makes a CA and a certificate for this job "
       "(openssl) and removes them when it ends"},
      {"tls-dir", true, tls_dir,
       "with --tls: a directory every node can read (default $HOME/.dlrun/tls)"},
      {"max-restarts", true, IntField<O>("max-restarts", &O::max_restarts, 0, 1000000),
       "worker-group restarts before the job fails (default 3)"},
      {"hang-timeout", true, hang, "restart workers silent for this many seconds (default off)"},
      {"log-dir", true, WordField<O>("log-dir", &O::log_dir), "per-rank log directory"},
      {"dlrun", true, WordField<O>("dlrun", &O::dlrun_path), "path of dlrun on the nodes"},
      {"output-script", true, StrField<O>(&O::script_path),
       "write the script here (-o; default: stdout)"},
      {"o", true, StrField<O>(&O::script_path), "same as --output-script"},
      {"submit", false, BoolField<O>(&O::submit), "submit with sbatch and print the job id"},
  };
}

std::string JoinCommand(const std::vector<std::string>& cmd) {
  std::vector<std::string> q;
  for (const auto& w : cmd) q.push_back(ShellQuote(w));
  return absl::StrJoin(q, " ");
}

std::string RandomHex(int bytes) {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < bytes; ++i) absl::StrAppend(&s, absl::Hex(rd() & 0xff, absl::kZeroPad2));
  return s;
}

}  // namespace

std::string ShellQuote(const std::string& word) {
  bool safe = !word.empty();
  for (unsigned char c : word) {
    safe = safe && (absl::ascii_isalnum(c) || std::string_view("@%+=:,./_-").find(c) !=
                                                   std::string_view::npos);
  }
  if (safe) return word;
  return absl::StrCat("'", absl::StrReplaceAll(word, {{"'", "'\\''"}}), "'");
}

absl::StatusOr<SlurmJobOptions> ParseSlurmArgs(const std::vector<std::string>& args) {
  SlurmJobOptions o;
  if (absl::Status s = ParseSub("slurm", SlurmFlags(), args, o, &o.command); !s.ok()) return s;
  if (o.nproc_per_node == 0) o.nproc_per_node = std::max(1, o.gpus_per_node);
  if (o.cpus_per_task == 0) {
    o.cpus_per_task = o.gpus_per_node > 0 ? 8 * o.gpus_per_node : o.nproc_per_node;
  }
  if (o.cpus_per_task < o.nproc_per_node) {
    return BadValue("cpus-per-task", absl::StrCat(o.cpus_per_task),
                    absl::StrCat("at least one CPU per worker (--nproc-per-node ",
                                 o.nproc_per_node, ")"));
  }
  o.generated_by = absl::StrCat("Generated by: dlrun slurm ", JoinCommand(args));
  return o;
}

std::string RenderSlurmScript(const SlurmJobOptions& o, const std::string& tmpl) {
  std::vector<std::string> sb;
  auto line = [&](const std::string& opt, const std::string& comment) {
    std::string l = absl::StrCat("#SBATCH ", opt);
    if (!comment.empty()) {
      l.resize(std::max<size_t>(l.size() + 1, 40), ' ');
      absl::StrAppend(&l, "# ", comment);
    }
    sb.push_back(l);
  };
  line(absl::StrCat("--job-name=", o.job_name), "");
  line(absl::StrCat("--nodes=", o.nodes), "one dlrun agent per node");
  line("--ntasks-per-node=1", "dlrun starts the workers itself");
  std::string cpu_note = absl::StrCat("for ", o.nproc_per_node, " worker(s) and data loading");
  if (o.gpus_per_node > 0) {
    const int per_gpu = o.cpus_per_task / o.gpus_per_node;
    absl::StrAppend(&cpu_note, per_gpu >= 8 && per_gpu <= 24
                                   ? "; 8-24 per GPU is the usual range"
                                   : absl::StrCat("; note: ", per_gpu,
                                                  " per GPU, outside the usual 8-24"));
  }
  line(absl::StrCat("--cpus-per-task=", o.cpus_per_task), cpu_note);
  if (o.gpus_per_node > 0) line(absl::StrCat("--gpus-per-node=", o.gpus_per_node), "");
  line(absl::StrCat("--time=", o.time), "");
  if (!o.partition.empty()) line(absl::StrCat("--partition=", o.partition), "");
  if (!o.account.empty()) line(absl::StrCat("--account=", o.account), "");
  if (!o.constraint.empty()) line(absl::StrCat("--constraint=", o.constraint), "");
  if (!o.qos.empty()) line(absl::StrCat("--qos=", o.qos), "");
  if (!o.mem.empty()) line(absl::StrCat("--mem=", o.mem), "");
  line(absl::StrCat("--output=", o.output), "%j is the job id");
  if (o.preemptible) {
    line(absl::StrCat("--signal=USR1@", o.signal_seconds), "warning before the time limit");
    line("--requeue", "a preempted or requeued job runs again");
    line("--open-mode=append", "keep the output of earlier runs");
  }
  for (const auto& extra : o.sbatch_options) line(extra, "");

  std::string preempt;
  if (o.preemptible) {
    preempt = absl::StrCat(
        "\n# Preemption: Slurm sends SIGUSR1 ", o.signal_seconds,
        " s before the time limit (and `scancel -s USR1` does too). dlrun\n"
        "# passes it to the workers; the trainer checkpoints and, because of the variable "
        "below,\n# rank 0 runs `scontrol requeue $SLURM_JOB_ID`. The requeued job runs this "
        "script again\n# (SLURM_RESTART_COUNT counts the runs) and the trainer resumes from its "
        "checkpoint.\nexport DLRUN_REQUEUE_ON_SIGNAL=1\n");
  }
  std::string tls;
  if (o.tls) {
    tls = absl::StrCat(
        "\n# Mutual TLS for the rendezvous (--tls): a CA and one certificate made for this job "
        "only,\n# in a directory that only you can read and every node sees (the agents read "
        "the files\n# when they start). The CA's key is deleted at once, so nothing else can be "
        "signed with\n# it, and the directory is removed when this script ends.\n"
        "tls_dir=",
        o.tls_dir.empty() ? "\"$HOME/.dlrun/tls\"" : ShellQuote(o.tls_dir),
        "/\"job-$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}\"\n"
        "(umask 077 && mkdir -p \"$tls_dir\")\n"
        "tls_dir=$(cd \"$tls_dir\" && pwd)\n"
        "trap 'rm -rf \"$tls_dir\"' EXIT\n"
        "tls_openssl() {  # quiet unless it fails\n"
        "  openssl \"$@\" 2>\"$tls_dir/openssl.err\" || { cat \"$tls_dir/openssl.err\" >&2; return 1; }\n"
        "}\n"
        "(\n"
        "  umask 077 && cd \"$tls_dir\"\n"
        "  tls_openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \\\n"
        "    -subj \"/CN=dlrun job $SLURM_JOB_ID CA\" -keyout ca.key -out ca.pem\n"
        "  tls_openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \\\n"
        "    -subj /CN=dlrun-rdzv -keyout node.key -out node.csr\n"
        "  printf 'subjectAltName=DNS:dlrun-rdzv\\nextendedKeyUsage=serverAuth,clientAuth\\n' >ext.cnf\n"
        "  tls_openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \\\n"
        "    -extfile ext.cnf -out node.pem\n"
        "  rm -f ca.key ca.srl node.csr ext.cnf openssl.err\n"
        ")\n"
        "export DLRUN_RDZV_TLS_CA=$tls_dir/ca.pem DLRUN_RDZV_TLS_CERT=$tls_dir/node.pem \\\n"
        "  DLRUN_RDZV_TLS_KEY=$tls_dir/node.key DLRUN_RDZV_TLS_SERVER_NAME=dlrun-rdzv\n");
  }
  std::string extra;
  if (o.preemptible) {
    absl::StrAppend(&extra, "    --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \\\n");
  }
  if (o.hang_timeout_s > 0) absl::StrAppend(&extra, "    --hang-timeout ", o.hang_timeout_s, " \\\n");
  if (!o.log_dir.empty()) absl::StrAppend(&extra, "    --log-dir ", o.log_dir, "/$SLURM_JOB_ID \\\n");

  return absl::StrReplaceAll(
      tmpl, {{"{{GENERATED_BY}}", o.generated_by},
             {"{{SBATCH_LINES}}", absl::StrJoin(sb, "\n")},
             {"{{NPROC}}", absl::StrCat(o.nproc_per_node)},
             {"{{MAX_RESTARTS}}", absl::StrCat(o.max_restarts)},
             {"{{RDZV_PORT_COMMENT}}",
              o.rdzv_port > 0 ? "fixed by --rdzv-port."
                              : "derived from the job id, so two jobs sharing a node do not "
                                "collide\n# (20000-29999, below Linux's ephemeral ports)."},
             {"{{RDZV_PORT}}", o.rdzv_port > 0 ? absl::StrCat(o.rdzv_port)
                                               : "$((20000 + SLURM_JOB_ID % 10000))"},
             {"{{PREEMPT_BLOCK}}", preempt},
             {"{{TLS_BLOCK}}", tls},
             {"{{DLRUN}}", ShellQuote(o.dlrun_path)},
             {"{{DLRUN_EXTRA}}", extra},
             {"{{PROGRAM}}", JoinCommand(o.command)}});
}

std::string SlurmUsage() {
  return Usage(
      "usage: dlrun slurm [options] -- PROGRAM [ARGS...]\n"
      "Writes an sbatch script that runs `srun dlrun ... PROGRAM ARGS` with one agent per node\n"
      "and the rendezvous on the first node; --submit also submits it.\n\noptions:\n",
      SlurmFlags());
}

// ---------------------------------------------------------------------------------------------
// Run:ai

namespace {

std::vector<SubFlag<RunaiJobOptions>> RunaiFlags() {
  using O = RunaiJobOptions;
  auto env = [](O& o, const std::string& v) {
    const auto eq = v.find('=');
    bool ok = eq != std::string::npos && eq > 0;
    for (size_t i = 0; ok && i < eq; ++i) {
      ok = absl::ascii_isalnum(v[i]) || v[i] == '_';
    }
    if (!ok || v.find('\n') != std::string::npos) return BadValue("env", v, "KEY=VALUE");
    o.env.push_back(v);
    return absl::OkStatus();
  };
  auto quantity = [](const std::string& flag, std::string O::*field) {
    return [=](O& o, const std::string& v) {
      bool ok = !v.empty() && absl::ascii_isdigit(v.front());
      for (char c : v) ok = ok && (absl::ascii_isalnum(c) || c == '.');
      if (!ok) return BadValue(flag, v, "a Kubernetes quantity such as 8, 500m or 64Gi");
      o.*field = v;
      return absl::OkStatus();
    };
  };
  auto dns = [](const std::string& flag, std::string O::*field) {
    return [=](O& o, const std::string& v) {
      // Kubernetes object names: lowercase letters, digits and '-', at most 63, alnum at ends.
      bool ok = !v.empty() && v.size() <= 63 && absl::ascii_isalnum(v.front()) &&
                absl::ascii_isalnum(v.back());
      for (char c : v) ok = ok && ((c >= 'a' && c <= 'z') || absl::ascii_isdigit(c) || c == '-');
      if (!ok) {
        return BadValue(flag, v, "a lowercase name of letters, digits and '-' (at most 63)");
      }
      o.*field = v;
      return absl::OkStatus();
    };
  };
  return {
      {"name", true, dns("name", &O::name), "workload name (required)"},
      {"project", true, dns("project", &O::project), "Run:ai project (-p)"},
      {"p", true, dns("project", &O::project), "same as --project"},
      {"image", true, WordField<O>("image", &O::image), "container image with dlrun (required)"},
      {"i", true, WordField<O>("image", &O::image), "same as --image"},
      {"workers", true, IntField<O>("workers", &O::workers, 0, 100000),
       "worker pods besides the master pod (default 1: 2 nodes)"},
      {"gpus", true, IntField<O>("gpus", &O::gpus, 0, 64), "GPUs per pod (-g; default 0)"},
      {"g", true, IntField<O>("gpus", &O::gpus, 0, 64), "same as --gpus"},
      {"nproc-per-node", true, IntField<O>("nproc-per-node", &O::nproc_per_node, 1, 1024),
       "workers per pod (default: one per GPU, 1 without GPUs)"},
      {"cpu", true, quantity("cpu", &O::cpu), "CPU request per pod"},
      {"memory", true, quantity("memory", &O::memory), "memory request per pod"},
      {"rdzv-port", true, IntField<O>("rdzv-port", &O::rdzv_port, 1, 65535),
       "rendezvous port on the master pod (default 29400)"},
      {"max-restarts", true, IntField<O>("max-restarts", &O::max_restarts, 0, 1000000),
       "worker-group restarts before the job fails (default 3)"},
      {"large-shm", false, BoolField<O>(&O::large_shm), "a large /dev/shm (data loaders)"},
      {"legacy-cli", false, BoolField<O>(&O::legacy_cli), "print `runai submit-dist pytorch`"},
      {"env", true, env, "KEY=VALUE for every pod (-e; repeatable)"},
      {"e", true, env, "same as --env"},
      {"dlrun", true, WordField<O>("dlrun", &O::dlrun_path), "path of dlrun in the image"},
      {"o", true, StrField<O>(&O::manifest_path), "also write a PyTorchJob manifest here"},
  };
}

std::string YamlQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<RunaiJobOptions> ParseRunaiArgs(const std::vector<std::string>& args) {
  RunaiJobOptions o;
  if (absl::Status s = ParseSub("runai", RunaiFlags(), args, o, &o.command); !s.ok()) return s;
  if (o.name.empty()) return absl::InvalidArgumentError("dlrun runai: --name NAME is required");
  if (o.image.empty()) return absl::InvalidArgumentError("dlrun runai: --image IMAGE is required");
  if (o.nproc_per_node == 0) o.nproc_per_node = std::max(1, o.gpus);
  return o;
}

std::vector<std::string> RunaiPodCommand(const RunaiJobOptions& o) {
  // Every pod runs the same agent. The master pod (MASTER_ADDR, set by the operator) hosts the
  // gRPC rendezvous on --rdzv-port; dlrun fills the endpoint in from MASTER_ADDR and orders
  // the pods by POD_INDEX / RANK (see `dlrun env` in a pod).
  std::vector<std::string> cmd = {o.dlrun_path,
                                  "--nnodes", absl::StrCat(o.workers + 1),
                                  "--nproc-per-node", absl::StrCat(o.nproc_per_node),
                                  "--rdzv-backend", "grpc",
                                  "--max-restarts", absl::StrCat(o.max_restarts),
                                  "--"};
  cmd.insert(cmd.end(), o.command.begin(), o.command.end());
  return cmd;
}

std::string RenderRunaiCommand(const RunaiJobOptions& o) {
  std::vector<std::string> w;
  if (o.legacy_cli) {
    w = {"runai", "submit-dist", "pytorch", "--name", o.name};
  } else {
    w = {"runai", "training", "pytorch", "submit", o.name};
  }
  if (!o.project.empty()) w.insert(w.end(), {"-p", o.project});
  w.insert(w.end(), {"-i", o.image});
  w.push_back(absl::StrCat("--workers=", o.workers));
  if (o.gpus > 0) w.insert(w.end(), {"-g", absl::StrCat(o.gpus)});
  if (!o.cpu.empty()) w.insert(w.end(), {"--cpu", o.cpu});
  if (!o.memory.empty()) w.insert(w.end(), {"--memory", o.memory});
  if (o.large_shm) w.push_back("--large-shm");
  w.insert(w.end(), {"-e", absl::StrCat("DLRUN_RDZV_PORT=", o.rdzv_port)});
  for (const auto& e : o.env) w.insert(w.end(), {"-e", e});
  w.insert(w.end(), {"--command", "--"});
  for (const auto& a : RunaiPodCommand(o)) w.push_back(a);
  return JoinCommand(w) + "\n";
}

std::string RenderRunaiManifest(const RunaiJobOptions& o) {
  // A PyTorchJob with one master and `workers` worker replicas, the shape Run:ai's distributed
  // PyTorch workloads take. The rendezvous token comes from a Secret created alongside.
  const std::string token_secret = absl::StrCat(o.name, "-dlrun-token");
  std::string s = absl::StrCat(
      "# Generated by `dlrun runai`: apply with `kubectl apply -f` (both objects).\n"
      "# Each pod runs one dlrun agent; the master pod hosts the rendezvous on port ",
      o.rdzv_port, ".\n",
      "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ", token_secret,
      "\n", o.project.empty() ? "" : absl::StrCat("  namespace: runai-", o.project, "\n"),
      "type: Opaque\nstringData:\n  token: ", RandomHex(24), "\n---\n",
      "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: ", o.name, "\n",
      o.project.empty() ? "" : absl::StrCat("  namespace: runai-", o.project, "\n"),
      "  labels:\n    project: ", o.project.empty() ? "default" : o.project, "\n",
      "spec:\n  pytorchReplicaSpecs:\n");
  auto replica = [&](const std::string& kind, int replicas) {
    absl::StrAppend(&s, "    ", kind, ":\n      replicas: ", replicas,
                    "\n      restartPolicy: OnFailure\n      template:\n        spec:\n");
    if (!o.project.empty()) absl::StrAppend(&s, "          schedulerName: runai-scheduler\n");
    absl::StrAppend(&s, "          containers:\n          - name: pytorch\n            image: ",
                    YamlQuote(o.image), "\n            command:\n");
    for (const auto& a : RunaiPodCommand(o)) absl::StrAppend(&s, "            - ", YamlQuote(a), "\n");
    absl::StrAppend(&s, "            env:\n            - name: DLRUN_RDZV_PORT\n              value: ",
                    YamlQuote(absl::StrCat(o.rdzv_port)), "\n",
                    "            - name: DLRUN_RDZV_TOKEN\n              valueFrom:\n"
                    "                secretKeyRef:\n                  name: ", token_secret,
                    "\n                  key: token\n");
    for (const auto& e : o.env) {
      const auto eq = e.find('=');
      absl::StrAppend(&s, "            - name: ", e.substr(0, eq), "\n              value: ",
                      YamlQuote(e.substr(eq + 1)), "\n");
    }
    absl::StrAppend(&s, "            ports:\n            - containerPort: ", o.rdzv_port,
                    "\n              name: dlrun-rdzv\n");
    if (o.gpus > 0 || !o.cpu.empty() || !o.memory.empty()) {
      absl::StrAppend(&s, "            resources:\n              limits:\n");
      if (o.gpus > 0) absl::StrAppend(&s, "                nvidia.com/gpu: ", o.gpus, "\n");
      if (!o.cpu.empty()) absl::StrAppend(&s, "                cpu: ", YamlQuote(o.cpu), "\n");
      if (!o.memory.empty()) absl::StrAppend(&s, "                memory: ", YamlQuote(o.memory), "\n");
    }
    if (o.large_shm) {
      absl::StrAppend(&s, "            volumeMounts:\n            - name: dshm\n              mountPath: /dev/shm\n"
                          "          volumes:\n          - name: dshm\n            emptyDir:\n"
                          "              medium: Memory\n");
    }
  };
  replica("Master", 1);
  if (o.workers > 0) replica("Worker", o.workers);
  return s;
}

std::string RunaiUsage() {
  return Usage(
      "usage: dlrun runai [options] -- PROGRAM [ARGS...]\n"
      "Prints the Run:ai command that runs PROGRAM under dlrun in a master pod plus --workers\n"
      "worker pods (one dlrun agent per pod); -o FILE also writes the equivalent manifest.\n\n"
      "options:\n",
      RunaiFlags());
}

}  // namespace dlrun::launcher
