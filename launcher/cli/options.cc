#include "launcher/cli/options.h"

#include <signal.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "launcher/cli/flags.h"
#include "launcher/cli/launch_flags.h"

namespace dlrun::launcher {
namespace {

using cli::BadValue;
using Flag = cli::Flag<LaunchOptions>;

}  // namespace

std::string CompletionScript(const std::string& shell) {
  std::string words;
  for (const Flag& f : LaunchFlags()) {
    absl::StrAppend(&words, words.empty() ? "" : " ", "--", f.name);
    if (!f.short_name.empty()) absl::StrAppend(&words, " -", f.short_name);
  }
  absl::StrAppend(&words, " env slurm runai rdzv-server stacks profile");
  if (shell == "tcsh") return absl::StrCat("complete dlrun 'p/*/(", words, ")/'\n");
  std::string script = absl::StrCat(
      "_dlrun() { COMPREPLY=($(compgen -W \"", words,
      "\" -- \"${COMP_WORDS[COMP_CWORD]}\")); }\ncomplete -o default -F _dlrun dlrun\n");
  if (shell == "zsh") script = "autoload -U +X bashcompinit && bashcompinit\n" + script;
  return script;
}

absl::StatusOr<NprocSpec> ParseNprocPerNode(const std::string& value) {
  NprocSpec n;
  n.text = value;
  if (value == "auto") {
    n.kind = NprocSpec::Kind::kAuto;
  } else if (value == "gpu") {
    n.kind = NprocSpec::Kind::kGpu;
  } else if (value == "cpu") {
    n.kind = NprocSpec::Kind::kCpu;
  } else if (value == "xpu") {
    n.kind = NprocSpec::Kind::kXpu;
  } else if (!absl::SimpleAtoi(value, &n.count) || n.count < 1 || n.count > 4096) {
    return BadValue("nproc-per-node", value, "auto, gpu, cpu or an integer 1-4096");
  }
  return n;
}

const char* RdzvBackendName(RdzvBackend b) {
  return b == RdzvBackend::kStatic ? "static" : "grpc";
}

namespace {

// --profile needs its ranks; the other --profile-* flags need --profile.
absl::Status CheckProfileFlags(const LaunchOptions& o) {
  if (o.profile.On() && o.profile.ranks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--profile ", ProfileToolName(o.profile.tool),
                                                   " needs --profile-ranks (e.g. 0 or 0,3)"));
  }
  for (const char* f : {"profile-ranks", "profile-steps", "profile-args"}) {
    if (!o.profile.On() && o.given.count(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f, " needs --profile (nsys, py-spy, perf or torch)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchOptions> ParseLaunchOptions(const std::vector<std::string>& args,
                                                 const EnvLookup& env, bool env_only) {
  LaunchOptions o;
  o.signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  cli::ParseSpec spec{env_only ? "dlrun env" : "dlrun", /*wants_program=*/true,
                      /*pet_fallback=*/true, /*program_optional=*/env_only, {"print-completion"}};
  auto given = cli::ParseCommand(spec, LaunchFlags(), args, o, &env);
  if (!given.ok()) return given.status();
  if (o.help || o.version) return o;
  o.given = *std::move(given);
  if (o.standalone) {
    // One node on loopback: a job that needs more would otherwise run alone, silently
    // (torchrun waits for nodes that can never reach localhost:0).
    if (o.min_nodes > 1) {
      return BadValue("nnodes",
                      o.min_nodes == o.max_nodes ? std::to_string(o.min_nodes)
                                                 : absl::StrCat(o.min_nodes, ":", o.max_nodes),
                      absl::StrCat("1 (or 1:N) with --standalone, which runs one node on "
                                   "loopback; for ", o.min_nodes,
                                   " nodes drop --standalone and give --rdzv-endpoint HOST:PORT"));
    }
    o.min_nodes = o.max_nodes = 1;
    o.node_rank = 0;
  }
  if (absl::Status st = CheckProfileFlags(o); !st.ok()) return st;
  if (o.node_rank >= o.max_nodes) {
    return BadValue("node-rank", std::to_string(o.node_rank),
                    absl::StrCat("an integer below --nnodes (", o.max_nodes, ")"));
  }
  return o;
}

std::vector<int> StdSpec::PerRank(int nproc) const {
  std::vector<int> out(nproc, all);
  for (const auto& [r, v] : by_rank) {
    if (r < nproc) out[r] = v;
  }
  return out;
}

bool StdSpec::Any() const {
  if (all != 0) return true;
  for (const auto& [r, v] : by_rank) {
    if (v != 0) return true;
  }
  return false;
}

std::string UsageText() {
  return cli::Usage(
      "usage: dlrun [options] PROGRAM [ARGS...]\n"
      "       dlrun env [options]       print the detected environment and resulting settings\n"
      "       dlrun rdzv-server [...]   run the rendezvous on its own (--help for its flags)\n"
      "       dlrun slurm [...] -- CMD  write (or --submit) an sbatch script running CMD\n"
      "       dlrun runai [...] -- CMD  print the Run:ai command (-o: manifest) running CMD\n"
      "       dlrun stacks [...]        the stacks of a running job's workers\n"
      "       dlrun profile --ranks L   py-spy or perf on ranks of a running job\n"
      "       dlrun preflight [...]     check this node (GPUs' health, disk, a compute probe)\n"
      "       dlrun bad-nodes [--clear] the nodes your jobs found bad (dlrun slurm excludes them)\n"
      "       dlrun --cmake-prefix-path the prefix of the C++ worker library's CMake package\n\n"
      "Starts one worker per slot with the torchrun worker environment (RANK, LOCAL_RANK,\n"
      "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). Flags accept '-' or '_' and fall back to\n"
      "PET_<FLAG> environment variables.\n\noptions:\n",
      LaunchFlags());
}

}  // namespace dlrun::launcher
