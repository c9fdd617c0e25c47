// `dlrun [options] PROGRAM ARGS` and `dlrun env`: one step per folder, in this order, each
// visited once: parse (cli/options.cc), detect the environment and the machine (detect/), plan
// (app/plan.cc), processes (workers/posix_processes.cc), the rendezvous backend (app/backends.cc:
// rdzv/ or the static source), run directory (app/run_location.cc), agent (agent/agent.cc).
// docs/ARCHITECTURE.md follows one launch through these steps.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "launcher/agent/agent.h"
#include "launcher/app/backends.h"
#include "launcher/app/commands.h"
#include "launcher/app/plan.h"
#include "launcher/app/run_location.h"
#include "launcher/cli/options.h"
#include "launcher/detect/env_detect.h"
#include "launcher/detect/machine.h"
#include "launcher/profile/live_profile.h"
#include "launcher/workers/posix_processes.h"

namespace dlrun::launcher {

int LaunchMain(const std::vector<std::string>& args, bool env_only) {
  const EnvLookup env = ProcessEnv();
  auto parsed = ParseLaunchOptions(args, env, env_only);
  if (!parsed.ok()) return Fail(parsed.status());
  const LaunchOptions& given = *parsed;
  if (given.help) return Print(UsageText());
  if (given.version) return Print(cli::VersionText());
  if (!given.print_completion.empty()) return Print(CompletionScript(given.print_completion));

  auto detected = DetectEnvironment(env, given);
  if (!detected.ok()) return Fail(detected.status());
  if (absl::Status s = CheckStaticEndpoint(detected->options); !s.ok()) return Fail(s);
  if (env_only) return Print(FormatDetection(*detected));
  const LaunchOptions& o = detected->options;  // the flags, completed by the environment
  const Machine machine = DetectMachine(o, env);

  auto plan = PlanLaunch(o, machine, env);
  if (!plan.ok()) return Fail(plan.status());
  PlanPreflight(o, machine.hostname, &*plan);
  AgentOptions& a = plan->agent;

  // Block the signals the agent handles before any thread exists (the rendezvous client starts
  // gRPC threads): threads inherit the mask, so SIGCHLD and the handled signals can only be read
  // from the agent's signalfd and are never swallowed by another thread.
  std::vector<int> handled = a.forwarded_signals;
  handled.insert(handled.end(), a.passthrough_signals.begin(), a.passthrough_signals.end());
  auto processes = PosixProcesses::Create(handled);
  if (!processes.ok()) return Fail(processes.status());

  auto backend = MakeBackend(o, *detected, machine, *plan, env);
  if (!backend.ok()) {
    // A host that does not resolve is not a usage error: DNS may be what is wrong, so exit 1.
    return absl::IsNotFound(backend.status()) ? FailRun(backend.status())
                                              : Fail(backend.status());
  }
  a.telemetry.serve_metrics = std::move(backend->serve_metrics);

  auto run_dir = MakeRunDir(o, plan->run_id, machine.hostname, env, &a.keep_run_dir);
  if (!run_dir.ok()) return Fail(run_dir.status());
  a.run_dir = *run_dir;
  if (a.keep_run_dir) a.log_dir = a.run_dir;
  if (o.profile.On()) {
    a.profiler = MakeToolProfiler(o.profile, plan->profile_tool, a.run_dir + "/profile",
                                  machine.hostname);
  }
  a.live_profile = [dir = a.run_dir + "/profile", host = machine.hostname,
                    python = a.argv.empty() ? std::string() : a.argv[0],
                    n = std::make_shared<std::atomic<int>>(0)](
                       const rdzv::ProfileAsk& ask, const std::vector<DumpTarget>& targets) {
    return AnswerLiveProfile(ask, targets, absl::StrCat(dir, "/live-", ++*n), host, python);
  };
  // `dlrun stacks` finds the run through this machine's index (RUN_DIR/workers.json).
  std::error_code ec;
  std::filesystem::create_directories(a.run_dir, ec);
  for (auto* v : {&a.spare_argv, &a.spare_argv_on_declaration, &a.fork_server_argv}) {
    *v = SpareArgvFromFile(*v, a.run_dir);
  }
  const std::string index = RunIndexDir(env("TMPDIR").value_or("/tmp"), getuid());
  RegisterRun(index, getpid(), a.run_dir);

  Agent agent(std::move(a), std::move(backend->link), **processes, SystemClock());
  const int rc = agent.Run();
  UnregisterRun(index, getpid());
  if (const auto mark = env(contract::kOutcomeMark); rc == 0 && mark && !mark->empty()) {
    std::printf("dlrun: %s: the job succeeded\n", mark->c_str());
    std::fflush(stdout);
  }
  return rc;
}

}  // namespace dlrun::launcher
