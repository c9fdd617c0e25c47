// The membership source of fixed flags (--standalone, --rdzv-backend static): the assignment
// never changes, restarts are counted here; beside the gRPC rendezvous' (rdzv_source.h), the
// agent's other MembershipSource and JobChannel.
#pragma once

#include <functional>

#include "common/assignment.h"
#include "launcher/agent/membership.h"
#include "telemetry/telemetry.h"

namespace dlrun::launcher {

// Fixed assignment; restarts are counted locally up to max_restarts. `pick_master_port`, when
// set, picks a fresh port per attempt (standalone).
JobLink MakeStaticSource(Assignment base, int max_restarts, std::function<int()> pick_master_port,
                         telemetry::TelemetryOptions telemetry = {});

}  // namespace dlrun::launcher
