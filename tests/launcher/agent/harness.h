// Runs the agent in-process against the fakes (fakes.h).
#pragma once

#include <signal.h>
#include <stdlib.h>

#include <memory>

#include "launcher/agent/agent.h"
#include "agent/fakes.h"
#include "launcher/rdzv/static_source.h"

namespace dlrun::launcher::testing {

struct Harness {
  FakeClock clock;
  FakeProcesses procs{clock};
  AgentOptions options;

  explicit Harness(int nproc) {
    options.argv = {"worker"};
    options.nproc = nproc;
    options.grace = seconds(30);
    options.kill_wait = seconds(10);
    options.forwarded_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    options.passthrough_signals = {SIGUSR1, SIGUSR2};
    options.exit_with_worker_code = true;  // the tests name the worker's code (torchrun: 1)
    options.telemetry.sample_processes = false;  // fake pids: nothing to read in /proc
    // In memory (procs.files): the agent tests make no file and no directory.
    options.file_system = &procs.files;
    options.run_dir = "/run/agent-test";
  }
  // The agent (and the source it owns) lives as long as the harness, so a test can read what
  // its ScriptedSource saw after Run() returns.
  int Run(JobLink link) {
    agent = std::make_unique<Agent>(options, std::move(link), procs, clock);
    return agent->Run();
  }
  // A source that is also its own job channel (ScriptedSource).
  template <class Both>
  int Run(std::unique_ptr<Both> both) {
    return Run(JobLink::Of(std::shared_ptr<Both>(std::move(both))));
  }
  std::unique_ptr<Agent> agent;
  // A static source, as `dlrun --standalone` uses.
  int RunStatic(int max_restarts) {
    Assignment a;
    a.world_size = a.local_world_size = options.nproc;
    return Run(MakeStaticSource(a, max_restarts, nullptr));
  }
};

}  // namespace dlrun::launcher::testing
