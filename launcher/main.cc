// dlrun: a torchrun-compatible launcher for distributed training.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/agent.h"
#include "launcher/env_detect.h"
#include "launcher/gpu_pick.h"
#include "launcher/job_script.h"
#include "launcher/net.h"
#include "launcher/options.h"
#include "launcher/rdzv_loader.h"
#include "launcher/rdzv_source.h"
#include "spdlog/spdlog.h"

namespace dl = dlrun::launcher;
namespace dlrun::launcher {
extern const char* const kSlurmTemplate;  // job_templates/dlrun.sbatch, compiled in
}

namespace {

// The CPUs this process may run on (its affinity mask, e.g. what Slurm gave the step).
std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < std::max(1L, n); ++c) cpus.push_back(c);
  }
  return cpus;
}

int CountGpus() {
  int n = 0;
  while (std::filesystem::exists("/dev/nvidia" + std::to_string(n))) ++n;
  return n;
}

std::string RandomRunId() {
  std::random_device rd;
  return absl::StrCat("dlrun-", absl::Hex(rd()), absl::Hex(rd()));
}

absl::StatusOr<std::vector<int>> ParseSignals(const std::string& list) {
  std::vector<int> out;
  for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    std::string n(name);
    if (absl::StartsWith(n, "SIG")) n = n.substr(3);
    int sig = 0;
    for (int s = 1; s < NSIG; ++s) {
      const char* abbrev = sigabbrev_np(s);
      if (abbrev != nullptr && n == abbrev) sig = s;
    }
    if (sig == 0 || sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid value '", name, "' in --signals-to-handle: expected signal names such as "
          "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"));
    }
    out.push_back(sig);
  }
  return out;
}

// The device id each worker gets in CUDA_VISIBLE_DEVICES: "auto" gives local rank i the i-th
// visible GPU (respecting an inherited CUDA_VISIBLE_DEVICES) when there is one per worker.
absl::StatusOr<std::vector<std::string>> ResolveGpus(const std::string& spec, int nproc) {
  std::vector<std::string> ids;
  if (spec == "none") return ids;
  if (spec == "auto") {
    if (const char* vis = std::getenv("CUDA_VISIBLE_DEVICES")) {
      ids = absl::StrSplit(vis, ',', absl::SkipEmpty());  // the scheduler chose: keep its order
    } else if (auto loads = dl::QueryGpuLoads(); loads && static_cast<int>(loads->size()) >= nproc) {
      for (int i : dl::PickLeastLoaded(*loads, nproc)) ids.push_back(std::to_string(i));
      spdlog::info("--gpus auto: the {} least-loaded GPU(s) by memory used and utilisation: {}",
                   nproc, absl::StrJoin(ids, ","));
    } else {
      for (int i = 0, n = CountGpus(); i < n; ++i) ids.push_back(std::to_string(i));
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

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "dlrun: %s\n", std::string(s.message()).c_str());
  return 2;
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--") return false;
    if (a == "-h" || a == "--help") return true;
  }
  return false;
}

std::string SelfPath() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("dlrun") : p.string();
}

bool WriteFile(const std::string& path, const std::string& text, bool executable) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return false;
  if (executable) std::filesystem::permissions(path, std::filesystem::perms::owner_exec |
                                                         std::filesystem::perms::group_exec,
                                               std::filesystem::perm_options::add);
  return true;
}

// `dlrun slurm [options] -- PROGRAM ARGS`: the sbatch script (stdout or -o), or submits it.
int SlurmMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    std::fputs(dl::SlurmUsage().c_str(), stdout);
    return 0;
  }
  auto o = dl::ParseSlurmArgs(args);
  if (!o.ok()) return Fail(o.status());
  if (o->dlrun_path == "dlrun") o->dlrun_path = SelfPath();
  const std::string script = dl::RenderSlurmScript(*o, dl::kSlurmTemplate);
  std::string path = o->script_path;
  if (path.empty() && o->submit) path = absl::StrCat("dlrun-", o->job_name, ".sbatch");
  if (path.empty() || path == "-") {
    std::fputs(script.c_str(), stdout);
    return 0;
  }
  if (!WriteFile(path, script, true)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot write the job script to '", path, "': ", std::strerror(errno))));
  }
  if (!o->submit) {
    std::fprintf(stderr, "dlrun: wrote %s (submit with: sbatch %s)\n", path.c_str(), path.c_str());
    return 0;
  }
  const std::string cmd = absl::StrCat("sbatch --parsable ", dl::ShellQuote(path));
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return Fail(absl::InternalError("cannot run sbatch"));
  char buf[256];
  std::string out;
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = pclose(p);
  if (status != 0) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "sbatch failed (exit status ", WEXITSTATUS(status), ") for ", path, "; see its message above")));
  }
  const std::string id = out.substr(0, out.find_first_of(";\n"));
  std::printf("%s\n", id.c_str());
  std::fprintf(stderr, "dlrun: submitted %s as job %s\n", path.c_str(), id.c_str());
  return 0;
}

// `dlrun runai [options] -- PROGRAM ARGS`: the runai command line; -o FILE: the manifest too.
int RunaiMain(const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    std::fputs(dl::RunaiUsage().c_str(), stdout);
    return 0;
  }
  auto o = dl::ParseRunaiArgs(args);
  if (!o.ok()) return Fail(o.status());
  std::fputs(dl::RenderRunaiCommand(*o).c_str(), stdout);
  if (!o->manifest_path.empty()) {
    if (!WriteFile(o->manifest_path, dl::RenderRunaiManifest(*o), false)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "cannot write the manifest to '", o->manifest_path, "': ", std::strerror(errno))));
    }
    std::fprintf(stderr, "dlrun: wrote %s (kubectl apply -f %s)\n", o->manifest_path.c_str(),
                 o->manifest_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_pattern("[dlrun %H:%M:%S.%e] %^%l%$: %v");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs(dl::UsageText().c_str(), args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }

  if (args[0] == "slurm") return SlurmMain({args.begin() + 1, args.end()});
  if (args[0] == "runai") return RunaiMain({args.begin() + 1, args.end()});
  if (args[0] == "rdzv-server") {
    auto api = dl::LoadRendezvous();
    if (!api.ok()) return Fail(api.status());
    return (*api)->ServerMain(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  const bool env_only = args[0] == "env";
  if (env_only) {
    args.erase(args.begin());
    args.push_back("true");  // `dlrun env [options]` needs no program
  }
  auto parsed = dl::ParseLaunchOptions(args, dl::ProcessEnv());
  if (!parsed.ok()) return Fail(parsed.status());
  dl::LaunchOptions o = *std::move(parsed);
  auto detected = dl::DetectEnvironment(dl::ProcessEnv(), &o);
  if (!detected.ok()) return Fail(detected.status());
  if (env_only) {
    std::fputs(dl::FormatDetection(*detected, o).c_str(), stdout);
    return 0;
  }

  const std::vector<int> cpus = AllowedCpus();
  const int ncpus = static_cast<int>(cpus.size());
  auto nproc = dl::ResolveNprocPerNode(o.nproc_per_node, CountGpus(), ncpus);
  if (!nproc.ok()) return Fail(nproc.status());
  auto signals = ParseSignals(o.signals_to_handle);
  if (!signals.ok()) return Fail(signals.status());

  const bool use_rdzv = !o.standalone && o.rdzv_backend != "static";
  if (!use_rdzv && !o.standalone && o.min_nodes != o.max_nodes) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "invalid value '", o.min_nodes, ":", o.max_nodes,
        "' for --nnodes: the static rendezvous needs a fixed node count N (use --rdzv-backend "
        "c10d for elastic MIN:MAX)")));
  }

  dl::AgentOptions a;
  a.nproc = *nproc;
  for (int sig : *signals) {
    // SIGUSR1/SIGUSR2 carry messages (e.g. Slurm's preemption warning): pass them on and keep
    // the job running. The others stop the job.
    (sig == SIGUSR1 || sig == SIGUSR2 ? a.passthrough_signals : a.forwarded_signals).push_back(sig);
  }
  a.grace = std::chrono::milliseconds(static_cast<int64_t>(o.grace_period_s * 1000));
  a.hang_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.hang_timeout_s * 1000));
  a.log_dir = o.log_dir;
  a.redirects = dl::StdSpecPerRank(o.redirects, *nproc);
  if (!o.local_ranks_filter.empty()) {
    auto ranks = dl::ParseRankList(o.local_ranks_filter, *nproc);
    if (!ranks.ok()) return Fail(ranks.status());
    a.console_ranks = *ranks;
  }
  if (const char* aff = std::getenv("DLRUN_CPU_AFFINITY"); aff == nullptr || std::string(aff) != "0") {
    a.cpus = cpus;
  }
  {
    auto gpus = ResolveGpus(o.gpus, *nproc);
    if (!gpus.ok()) return Fail(gpus.status());
    a.gpus = *gpus;
  }

  // torchrun runs .py files (and -m modules) with the Python interpreter.
  if (o.module) {
    a.argv = {"python3", "-m"};
  } else if (!o.no_python && absl::EndsWith(o.command[0], ".py")) {
    a.argv = {"python3", "-u"};
  }
  a.argv.insert(a.argv.end(), o.command.begin(), o.command.end());

  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    a.omp_threads = std::max(1, ncpus / *nproc);
    if (*nproc > 1) {
      spdlog::info("OMP_NUM_THREADS is unset: setting it to {} ({} CPUs / {} workers)",
                   a.omp_threads, ncpus, *nproc);
    }
  }

  // Block the signals the agent handles before any thread exists (the rendezvous client starts
  // gRPC threads): threads inherit the mask, so SIGCHLD and the forwarded signals can only be
  // read from the agent's signalfd and are never swallowed by another thread.
  std::vector<int> handled = a.forwarded_signals;
  handled.insert(handled.end(), a.passthrough_signals.begin(), a.passthrough_signals.end());
  dl::BlockAgentSignals(handled);

  std::unique_ptr<dl::MembershipSource> source;
  std::string run_id = o.rdzv_id;
  if (use_rdzv) {
    if (o.rdzv_endpoint.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--rdzv-endpoint is empty: the rendezvous needs HOST[:PORT] (the same on every node)"));
    }
    dl::RdzvSourceOptions r;
    r.endpoint = o.rdzv_endpoint;
    r.run_id = o.rdzv_id;
    const char* token = std::getenv("DLRUN_RDZV_TOKEN");
    if (token == nullptr || *token == '\0') {
      spdlog::warn("DLRUN_RDZV_TOKEN is unset: any agent that knows the run id can join; set "
                   "it to a secret shared by the job's nodes");
      r.token = absl::StrCat("run-id:", o.rdzv_id);
    } else {
      r.token = token;
    }
    auto tls = dlrun::rdzv::TlsConfigFromEnv();
    if (!tls.ok()) return Fail(tls.status());
    r.tls = std::move(*tls);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    r.hostname = host;
    const std::string ep_host = o.rdzv_endpoint.substr(0, o.rdzv_endpoint.rfind(':'));
    r.local_addr = !o.local_addr.empty() ? o.local_addr : dl::LocalAddressFor(ep_host);
    if (r.local_addr.empty()) r.local_addr = host;
    r.nproc = *nproc;
    r.slurm_node_id = detected->slurm_node_id;
    r.expected_hosts = detected->expected_hosts;
    r.min_nodes = o.min_nodes;
    r.max_nodes = o.max_nodes;
    r.max_restarts = o.max_restarts;
    r.role = o.role;
    if (absl::Status s = dl::ApplyRdzvConf(o.rdzv_conf, &r); !s.ok()) return Fail(s);
    auto src = dl::MakeRendezvousSource(std::move(r));
    if (!src.ok()) return Fail(src.status());
    source = std::move(*src);
  } else {
    dl::NodeAssignment base;
    base.node_rank = o.node_rank;
    base.num_nodes = o.max_nodes;
    base.local_world_size = *nproc;
    base.world_size = o.max_nodes * *nproc;
    base.rank_offset = o.node_rank * *nproc;
    base.role = o.role;
    base.master_addr = o.master_addr;
    base.master_port = o.master_port;
    base.run_id = o.rdzv_id;
    std::function<int()> pick;
    if (o.standalone) {
      base.master_addr = "127.0.0.1";
      base.run_id = RandomRunId();
      if (!o.master_port_given) pick = [] { return dl::FreeTcpPort("127.0.0.1"); };
    }
    run_id = base.run_id;
    source = dl::MakeStaticSource(base, o.max_restarts, pick);
  }

  const char* tmp = std::getenv("TMPDIR");
  a.run_dir = absl::StrCat(tmp ? tmp : "/tmp", "/dlrun-", getuid(), "/", run_id, "-", getpid());
  const std::string run_dir = a.run_dir;
  dl::Agent agent(std::move(a), std::move(source));
  const int rc = agent.Run();
  if (rc == 0) {
    std::error_code ec;
    std::filesystem::remove_all(run_dir, ec);
  } else {
    spdlog::info("worker error files are kept in {}", run_dir);
  }
  return rc;
}
