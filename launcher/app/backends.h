// The rendezvous backends a launch can use, one factory each in a registry (backends.cc):
// "grpc", dlrun's gRPC rendezvous (--rdzv-backend c10d, grpc or dlrun; launcher/rdzv/);
// "static" (--rdzv-backend static) and "standalone" (rdzv/static_source.cc). Each makes the
// agent's membership and job channel (launcher/agent/membership.h) from the options, the
// detection and the plan. Also the metrics server's factory, since the rendezvous plugin
// serves it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/agent/membership.h"
#include "launcher/app/plan.h"
#include "launcher/cli/options.h"
#include "launcher/detect/env_detect.h"
#include "launcher/detect/machine.h"

namespace dlrun::launcher {

struct Backend {
  JobLink link;
  // --metrics-port: TelemetryOptions::serve_metrics; empty without it.
  std::function<std::shared_ptr<void>(std::shared_ptr<telemetry::JobTelemetry>)> serve_metrics;
};

// Errors are one line. NotFound: the rendezvous host does not resolve (checked once the endpoint
// list is parsed, before anything starts: it would otherwise be retried, silently, for the whole
// join timeout); that is not a usage error.
absl::StatusOr<Backend> MakeBackend(const LaunchOptions& o, const Detection& d, const Machine& m,
                                    const LaunchPlan& plan, const EnvLookup& env);

// The registry's names, in its order ("grpc", "static", "standalone").
std::vector<std::string> BackendNames();

}  // namespace dlrun::launcher
