// Serving job telemetry over HTTP (docs/TELEMETRY.md): /metrics, /api/job and the live page.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/api.h"
#include "rendezvous/telemetry.h"

namespace dlrun::rdzv {

// The snapshot in Prometheus' text exposition format.
std::string PrometheusText(const JobTelemetry::Snapshot& s);

// Serves `telemetry` on addr:port (0: any free port) until the result is destroyed.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    std::shared_ptr<JobTelemetry> telemetry, const std::string& addr, int port);

}  // namespace dlrun::rdzv
