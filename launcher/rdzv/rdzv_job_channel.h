// The job channel over dlrun's rendezvous (the proto's `service JobChannel`; the interface is
// launcher/workers/job_channel.h): this node's figures for the job's report go to the current
// host, and what the job asks of this node (a job-wide `dlrun stacks` or `dlrun profile`) comes
// back, in one exchange that RdzvSource paces with its heartbeats. A miss is not a membership
// matter: the next exchange tries again.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "launcher/workers/job_channel.h"
#include "rendezvous/api.h"
#include "telemetry/telemetry.h"

namespace dlrun::launcher {

class RdzvJobChannel final : public JobChannel {
 public:
  RdzvJobChannel(std::string node_id, std::string hostname, std::string run_id, std::string token)
      : node_id_(std::move(node_id)), hostname_(std::move(hostname)), run_id_(std::move(run_id)),
        token_(std::move(token)) {}

  // The current host's client, and the rendezvous this agent hosts (null: none); RdzvSource
  // calls this whenever either changes (a failover, a takeover). Neither is owned.
  void Use(rdzv::RendezvousClient* client, rdzv::HostedRendezvous* hosted) {
    client_ = client;
    hosted_ = hosted;
  }
  // After each answered heartbeat (every few in a job of thousands of nodes:
  // rdzv::PublishesAfter) and before the leave: this node's figures when new since the last
  // one sent, and in return what the job asks of it.
  void Exchange();

  void Publish(const telemetry::NodeTelemetry& t) override;
  std::shared_ptr<telemetry::JobTelemetry> job_telemetry() const override;
  Wanted DiagnosticsWanted() const override;
  void PostDiagnostics(uint64_t id, const std::string& answer_json) override;
  RdzvAddress Address() const override;

 private:
  const std::string node_id_, hostname_, run_id_, token_;
  rdzv::RendezvousClient* client_ = nullptr;
  rdzv::HostedRendezvous* hosted_ = nullptr;
  std::optional<telemetry::NodeTelemetry> telemetry_;  // the latest Publish
  uint64_t published_ = 0, sent_ = 0;  // Publish calls; the count when last sent
  rdzv::DiagnosticsAsk wanted_;  // the last exchange's (docs/STACKS.md)
  uint64_t posted_ = 0;
};

}  // namespace dlrun::launcher
