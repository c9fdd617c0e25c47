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
  if (!o.exclude.empty()) {
    line(absl::StrCat("--exclude=", o.exclude),
         o.bad_nodes > 0 ? absl::StrCat(o.bad_nodes, " found bad before (dlrun bad-nodes)") : "");
  }
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
  const std::pair<const char*, const std::string*> profile[] = {
      {"profile", &o.profile}, {"profile-ranks", &o.profile_ranks},
      {"profile-steps", &o.profile_steps}, {"profile-args", &o.profile_args}};
  for (const auto& [flag, value] : profile) {
    if (!value->empty()) absl::StrAppend(&extra, "    --", flag, " ", ShellQuote(*value), " \\\n");
  }
  return extra;
}

// Containers: what srun adds, and the command that starts dlrun.
std::string ContainerSrunOptions(const SlurmJobOptions& o) {
  std::string opts;
  if (!o.container_image.empty()) {
    absl::StrAppend(&opts, " \\\n  --container-image=", ShellQuote(o.container_image));
    if (!o.container_mounts.empty()) {
      absl::StrAppend(&opts, " --container-mounts=", ShellQuote(o.container_mounts));
    }
    if (!o.container_workdir.empty()) {
      absl::StrAppend(&opts, " --container-workdir=", ShellQuote(o.container_workdir));
    }
  }
  if (!o.container_bundle.empty()) {
    absl::StrAppend(&opts, " \\\n  --container=", ShellQuote(o.container_bundle));
  }
  return opts;
}

std::string DlrunCommand(const SlurmJobOptions& o) {
  if (o.apptainer_image.empty()) return ShellQuote(o.dlrun_path);
  std::string c = "apptainer exec";
  if (o.gpus_per_node > 0) c += " --nv";
  if (!o.container_mounts.empty()) absl::StrAppend(&c, " --bind ", ShellQuote(o.container_mounts));
  absl::StrAppend(&c, " ", ShellQuote(o.apptainer_image), " ", ShellQuote(o.dlrun_path));
  return c;
}

std::string ContainerNote(const SlurmJobOptions& o) {
  std::string where;
  if (!o.container_image.empty()) {
    where = absl::StrCat("pyxis imports ", o.container_image,
                         " once per node (enroot) and starts\n# the agent in it");
  } else if (!o.container_bundle.empty()) {
    where = absl::StrCat("Slurm starts the agent in the OCI bundle ", o.container_bundle,
                         "\n# with the runtime its oci.conf names (runc, crun)");
  } else if (!o.apptainer_image.empty()) {
    where = absl::StrCat("apptainer starts the agent in ", o.apptainer_image,
                         o.gpus_per_node > 0 ? " (--nv: the GPUs' devices and driver)" : "");
  } else {
    return "";
  }
  return absl::StrCat(
      "\n# In a container: ", where,
      ". The agent restarts its\n# workers inside the same container, so a restart imports "
      "nothing again. Slurm's variables, this\n# script's exports and signals (scancel, "
      "--signal) reach the agent as they do without a container.\n");
}

}  // namespace

std::string RenderSlurmScript(const SlurmJobOptions& o, const std::string& tmpl) {
  const std::string preempt = PreemptBlock(o), tls = TlsBlock(o), extra = ExtraFlags(o);
  return absl::StrReplaceAll(
      // A newline in an argument would end the comment, and the #SBATCH lines after a command
      // are ignored: every line of the command line stays a comment.
      tmpl, {{"{{GENERATED_BY}}", absl::StrReplaceAll(
                                    absl::StrCat("Generated by: dlrun slurm ", JoinCommand(o.args)),
                                    {{"\n", "\n#   "}})},
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
             {"{{DLRUN}}", DlrunCommand(o)},
             {"{{CONTAINER_NOTE}}", ContainerNote(o)},
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
                                           : "--kill-on-bad-exit=1",
                           ContainerSrunOptions(o))},
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
             {"{{OUTCOME_VAR}}", contract::kOutcomeMark},
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



}  // namespace dlrun::launcher
