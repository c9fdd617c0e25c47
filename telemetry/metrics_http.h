// Serving job telemetry over HTTP (docs/TELEMETRY.md): /metrics, /api/job and the live page.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "telemetry/telemetry.h"

namespace dlrun::telemetry {

// The HTTP side of telemetry: /metrics, /api/job and the live page, served until destroyed.
class MetricsServer {
 public:
  virtual ~MetricsServer() = default;
  virtual int port() const = 0;
};

// The snapshot in Prometheus' text exposition format.
std::string PrometheusText(const JobTelemetry::Snapshot& s);

// Serves `telemetry` on addr:port (0: any free port) until the result is destroyed.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    std::shared_ptr<JobTelemetry> telemetry, const std::string& addr, int port);

}  // namespace dlrun::telemetry
