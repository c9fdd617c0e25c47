#include "launcher/jobgen/job_script.h"

#include "common/contract.h"
#include "launcher/jobgen/shell.h"

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

std::vector<cli::Flag<SlurmJobOptions>> SlurmFlags() {
  using O = SlurmJobOptions;
  auto time = [](O& o, const std::string& v) {
    // sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    bool ok = !v.empty() && v.size() < 16;
    for (char c : v) ok = ok && (absl::ascii_isdigit(c) || c == ':' || c == '-');
    if (!ok || !absl::ascii_isdigit(v.front()) || !absl::ascii_isdigit(v.back())) {
      return cli::BadValue("time", v, "a Slurm time limit such as 30, 04:00:00 or 1-12:00:00");
    }
    o.time = v;
    return absl::OkStatus();
  };
  auto extra = [](O& o, const std::string& v) {
    if (!absl::StartsWith(v, "--") || v.find('\n') != std::string::npos) {
      return cli::BadValue("sbatch-option", v, "one sbatch option such as --mail-type=END");
    }
    o.sbatch_options.push_back(v);
    return absl::OkStatus();
  };
  auto tls_dir = [](O& o, const std::string& v) {
    if (v.empty() || v.find_first_of("\n\r") != std::string::npos) {
      return cli::BadValue("tls-dir", v, "a directory path that every node of the job can read");
    }
    o.tls_dir = v;
    o.tls = true;
    return absl::OkStatus();
  };
  return {
      {"nodes", "N", true, cli::IntField<O>("nodes", &O::nodes, 1, 100000), "nodes (as sbatch -N; default 1)"},
      {"min-nodes", "", true, cli::IntField<O>("min-nodes", &O::min_nodes, 1, 100000),
       "elastic: carry on with at least this many nodes when others are lost, the first "
       "(rendezvous) node included (default: all --nodes)"},
      {"gpus-per-node", "", true, cli::IntField<O>("gpus-per-node", &O::gpus_per_node, 0, 64),
       "GPUs per node (default 0: CPU workers)"},
      {"nproc-per-node", "", true, cli::IntField<O>("nproc-per-node", &O::nproc_per_node, 1, 1024),
       "workers per node (default: one per GPU, 1 without GPUs)"},
      {"cpus-per-task", "", true, cli::IntField<O>("cpus-per-task", &O::cpus_per_task, 1, 100000),
       "CPUs for each node's agent and its workers (default 8 per GPU; 1 per worker on CPU)"},
      {"time", "t", true, time, "time limit (default 01:00:00)"},
      {"job-name", "J", true, WordField<O>("job-name", &O::job_name), "job name (default dlrun)"},
      {"partition", "p", true, WordField<O>("partition", &O::partition), "partition (sbatch -p)"},
      {"account", "A", true, WordField<O>("account", &O::account), "account (sbatch -A)"},
      {"constraint", "C", true, WordField<O>("constraint", &O::constraint), "node features (sbatch -C)"},
      {"qos", "", true, WordField<O>("qos", &O::qos), "quality of service"},
      {"mem", "", true, WordField<O>("mem", &O::mem), "memory per node, e.g. 64G"},
      {"output", "", true, WordField<O>("output", &O::output), "output file pattern (default dlrun-%j.out)"},
      {"sbatch-option", "", true, extra, "one more #SBATCH line, e.g. --mail-type=END (repeatable)"},
      {"preemptible", "", false, cli::BoolField<O>(&O::preemptible),
       "SIGUSR1 before the end -> checkpoint, requeue, resume (--signal, --requeue)"},
      {"signal-seconds", "", true, cli::IntField<O>("signal-seconds", &O::signal_seconds, 1, 65535),
       "with --preemptible: seconds of warning before the end (default 90)"},
      {"rdzv-port", "", true, cli::IntField<O>("rdzv-port", &O::rdzv_port, 1, 65535),
       "rendezvous port on the first node (default: 20000 + job id % 10000)"},
      {"tls", "", false, cli::BoolField<O>(&O::tls),
       "mutual TLS for the rendezvous: the script makes a CA and a certificate for this job "
       "(openssl) and removes them when it ends"},
      {"tls-dir", "", true, tls_dir,
       "with --tls: a directory every node can read (default $HOME/.dlrun/tls)"},
      {"max-restarts", "", true, cli::IntField<O>("max-restarts", &O::max_restarts, 0, 1000000),
       absl::StrCat("worker-group restarts before the job fails (default ",
                    defaults::kJobMaxRestarts, ")")},
      {"hang-timeout", "", true, cli::DurationField<O>("hang-timeout", &O::hang_timeout, true), "restart workers silent for this many seconds (default off)"},
      {"log-dir", "", true, WordField<O>("log-dir", &O::log_dir), "per-rank log directory"},
      {"metrics-port", "", true, cli::IntField<O>("metrics-port", &O::metrics_port, 1, 65535),
       "serve the job's live page, /metrics (Prometheus) and /api/job on this port of the first "
       "node; the job's output says where to point a browser"},
      {"dlrun", "", true, WordField<O>("dlrun", &O::dlrun_path), "path of dlrun on the nodes"},
      {"output-script", "o", true, cli::StrField<O>(&O::script_path),
       "write the script here (-o; default: stdout)"},
      {"submit", "", false, cli::BoolField<O>(&O::submit), "submit with sbatch and print the job id"},
  };
}

}  // namespace

absl::StatusOr<SlurmJobOptions> ParseSlurmArgs(const std::vector<std::string>& args) {
  SlurmJobOptions o;
  auto parsed = cli::ParseFlags(cli::ParseSpec{"dlrun slurm"}, SlurmFlags(), args, o);
  if (!parsed.ok()) return parsed.status();
  o.command = std::move(parsed->program);
  if (o.min_nodes > o.nodes) {
    return cli::BadValue("min-nodes", absl::StrCat(o.min_nodes),
                         absl::StrCat("at most --nodes (", o.nodes, ")"));
  }
  if (o.min_nodes == o.nodes) o.min_nodes = 0;  // not elastic
  if (o.nproc_per_node == 0) o.nproc_per_node = std::max(1, o.gpus_per_node);
  if (o.cpus_per_task == 0) {
    o.cpus_per_task = o.gpus_per_node > 0 ? 8 * o.gpus_per_node : o.nproc_per_node;
  }
  if (o.cpus_per_task < o.nproc_per_node) {
    return cli::BadValue("cpus-per-task", absl::StrCat(o.cpus_per_task),
                    absl::StrCat("at least one CPU per worker (--nproc-per-node ",
                                 o.nproc_per_node, ")"));
  }
  o.generated_by = absl::StrCat("Generated by: dlrun slurm ", JoinCommand(args));
  return o;
}

namespace {

// The #SBATCH lines, each with a comment saying why.
std::string SbatchLines(const SlurmJobOptions& o) {
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
  if (o.min_nodes > 0) {
    line("--no-kill", absl::StrCat("keep the job when a node fails: >= ", o.min_nodes,
                                   " node(s) carry on"));
  }
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
  return absl::StrJoin(sb, "\n");
}

// --preemptible: what happens on SIGUSR1, and the variable that makes rank 0 requeue the job.
std::string PreemptBlock(const SlurmJobOptions& o) {
  std::string preempt;
  if (o.preemptible) {
    preempt = absl::StrCat(
        "\n# Preemption: Slurm sends SIGUSR1 ", o.signal_seconds,
        " s before the time limit (and `scancel -s USR1` does too). dlrun\n"
        "# passes it to the workers; the trainer checkpoints and, because of the variable "
        "below,\n# rank 0 runs `scontrol requeue $SLURM_JOB_ID`. The requeued job runs this "
        "script again\n# (SLURM_RESTART_COUNT counts the runs) and the trainer resumes from its "
        "checkpoint.\n# A Python trainer does this with dlrun_report.Preemption() (requested(), "
        "checkpointed());\n# without a SIGUSR1 handler its workers exit instead.\nexport ", contract::kRequeueOnSignal, "=1\n");
  }
  return preempt;
}

// --tls: a CA and certificate for this job only.
std::string TlsBlock(const SlurmJobOptions& o) {
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
        "export ", contract::kRdzvTlsCa, "=$tls_dir/ca.pem ", contract::kRdzvTlsCert,
        "=$tls_dir/node.pem \\\n  ", contract::kRdzvTlsKey, "=$tls_dir/node.key ",
        contract::kRdzvTlsServerName, "=dlrun-rdzv\n");
  }
  return tls;
}

// dlrun's own flags that depend on the options.
std::string ExtraFlags(const SlurmJobOptions& o) {
  std::string extra;
  if (o.preemptible) {
    absl::StrAppend(&extra, "    --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \\\n");
  }
  if (o.hang_timeout.count() > 0) {
    absl::StrAppend(&extra, "    --hang-timeout ", o.hang_timeout.count() / 1000.0, " \\\n");
  }
  if (!o.log_dir.empty()) absl::StrAppend(&extra, "    --log-dir ", o.log_dir, "/$SLURM_JOB_ID \\\n");
  if (o.metrics_port > 0) absl::StrAppend(&extra, "    --metrics-port ", o.metrics_port, " \\\n");
  return extra;
}

}  // namespace

std::string RenderSlurmScript(const SlurmJobOptions& o, const std::string& tmpl) {
  const std::string preempt = PreemptBlock(o), tls = TlsBlock(o), extra = ExtraFlags(o);
  return absl::StrReplaceAll(
      // A newline in an argument would end the comment, and the #SBATCH lines after a command
      // are ignored: every line of the command line stays a comment.
      tmpl, {{"{{GENERATED_BY}}", absl::StrReplaceAll(o.generated_by, {{"\n", "\n#   "}})},
             {"{{SBATCH_LINES}}", SbatchLines(o)},
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
             {"{{SRUN_NOTE}}",
              o.min_nodes > 0
                  ? absl::StrCat(
                        "Elastic (--min-nodes ", o.min_nodes,
                        "): a lost node or agent must not end\n# the step, so no "
                        "--kill-on-bad-exit, and --no-kill keeps it through a node failure. The\n"
                        "# survivors re-form the job, taking over the rendezvous if its node was "
                        "lost\n# (docs/FAILOVER.md). srun's exit status is then that of the lost "
                        "agent, even when\n# the others finished the training.")
                  : "--kill-on-bad-exit ends the step on every node if one agent fails for\n"
                    "# good (after its restarts), instead of leaving the others waiting at the "
                    "rendezvous."},
             // Since Slurm 22.05 srun does not inherit --cpus-per-task from sbatch: without it
             // a cluster that binds tasks gives the agent and all its workers one core.
             {"{{SRUN_OPTIONS}}",
              absl::StrCat("--cpus-per-task=\"${SLURM_CPUS_PER_TASK:-", o.cpus_per_task, "}\" ",
                           o.min_nodes > 0 ? "--kill-on-bad-exit=0 --no-kill"
                                           : "--kill-on-bad-exit=1")},
             {"{{NNODES}}", o.min_nodes > 0
                                ? absl::StrCat("\"", o.min_nodes, ":$SLURM_JOB_NUM_NODES\"")
                                : std::string("\"$SLURM_JOB_NUM_NODES\"")},
             {"{{DLRUN_EXTRA}}", extra},
             {"{{METRICS_NOTE}}",
              o.metrics_port > 0
                  ? absl::StrCat("echo \"dlrun: the job's live page: http://${head_addr:-$head_node}:",
                                 o.metrics_port, "/ (Prometheus: /metrics, JSON: /api/job)\"\n")
                  : ""},
             {"{{TOKEN_VAR}}", contract::kRdzvToken},
             {"{{PROGRAM}}", JoinCommand(o.command)}});
}

std::string PythonScriptOf(const std::vector<std::string>& command) {
  if (command.empty()) return "";
  const std::string& prog = command[0];
  const std::string base = prog.substr(prog.find_last_of('/') + 1);
  if (absl::EndsWith(base, ".py")) return prog;
  if (!absl::StartsWith(base, "python")) return "";
  for (size_t i = 1; i < command.size(); ++i) {
    const std::string& a = command[i];
    if (a == "-m" || a == "-c" || a == "-") return "";
    if (a == "-X" || a == "-W" || a == "-Q") {  // options with a separate value
      ++i;
      continue;
    }
    if (a.empty() || a[0] != '-') return a;
  }
  return "";
}

bool UsesPreemptionHook(const std::string& source) {
  return absl::StrContains(source, "Preemption(") || absl::StrContains(source, "SIGUSR1");
}

std::string SlurmUsage() {
  return cli::Usage(
      "usage: dlrun slurm [options] -- PROGRAM [ARGS...]\n"
      "Writes an sbatch script that runs `srun dlrun ... PROGRAM ARGS` with one agent per node\n"
      "and the rendezvous on the first node; --submit also submits it.\n\noptions:\n",
      SlurmFlags());
}


}  // namespace dlrun::launcher
