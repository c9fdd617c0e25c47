// What goes between this node and the job besides membership (MembershipSource): the node's
// figures for the job's report (docs/TELEMETRY.md), and what the job asks of the node (a
// job-wide `dlrun stacks` or `dlrun profile`). Over dlrun's rendezvous it is the proto's
// `service JobChannel` (launcher/rdzv/rdzv_source.cc); a static job keeps it in-process.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/types.h"
#include "telemetry/telemetry.h"

namespace dlrun::launcher {

class JobChannel {
 public:
  virtual ~JobChannel() = default;
  // This node's latest telemetry: sent on the channel's next exchange, or fed to the local
  // aggregate of a single-node job.
  virtual void Publish(const telemetry::NodeTelemetry& t) = 0;
  // The job-wide aggregate when this agent holds it (single-node jobs, the rendezvous host),
  // else null.
  virtual std::shared_ptr<telemetry::JobTelemetry> job_telemetry() const = 0;

  // A job-wide `dlrun stacks` (docs/STACKS.md) or, with `profile`, `dlrun profile`
  // (docs/PROFILING.md, "On a running job") asked this node to answer request `id` (0: none
  // pending); the agent answers with PostDiagnostics.
  struct Wanted {
    uint64_t id = 0;
    std::optional<rdzv::ProfileAsk> profile;
  };
  virtual Wanted DiagnosticsWanted() const { return {}; }
  virtual void PostDiagnostics(uint64_t id, const std::string& answer_json) {}

  // Where `dlrun stacks` reaches this job's rendezvous (the current host), and its secret;
  // empty endpoint for a static job.
  struct RdzvAddress {
    std::string endpoint, run_id, token;
  };
  virtual RdzvAddress Address() const { return {}; }
};

}  // namespace dlrun::launcher
