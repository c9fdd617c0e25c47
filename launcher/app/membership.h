// Where a launch's assignments come from: dlrun's gRPC rendezvous (--rdzv-backend c10d, grpc
// or dlrun; launcher/rdzv/) or a static source (standalone, --rdzv-backend static;
// agent/static_source.cc), built from the options, the detection and the plan. Also the metrics
// server's factory, since the rendezvous plugin serves it.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "launcher/agent/membership.h"
#include "launcher/app/plan.h"
#include "launcher/cli/options.h"
#include "launcher/detect/env_detect.h"
#include "launcher/detect/machine.h"

namespace dlrun::launcher {

struct Membership {
  std::unique_ptr<MembershipSource> source;
  // --metrics-port: TelemetryOptions::serve_metrics; empty without it.
  std::function<std::shared_ptr<void>(std::shared_ptr<telemetry::JobTelemetry>)> serve_metrics;
};

// Errors are one line. NotFound: the rendezvous host does not resolve (checked once the endpoint
// list is parsed, before anything starts: it would otherwise be retried, silently, for the whole
// join timeout); that is not a usage error.
absl::StatusOr<Membership> MakeMembership(const LaunchOptions& o, const Detection& d,
                                          const Machine& m, const LaunchPlan& plan,
                                          const EnvLookup& env);

}  // namespace dlrun::launcher
