#include "launcher/rdzv/rdzv_job_channel.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace dlrun::launcher {

void RdzvJobChannel::Exchange() {
  if (client_ == nullptr) return;
  const bool fresh = telemetry_ && published_ != sent_;
  auto r = client_->Publish(node_id_, fresh ? &*telemetry_ : nullptr);
  if (!r.ok()) {
    spdlog::debug("job channel: {}", std::string(r.status().message()));
    return;
  }
  sent_ = published_;
  wanted_ = *std::move(r);
}

void RdzvJobChannel::Publish(const telemetry::NodeTelemetry& t) {
  telemetry_ = t;
  ++published_;
}

std::shared_ptr<telemetry::JobTelemetry> RdzvJobChannel::job_telemetry() const {
  return hosted_ != nullptr ? hosted_->telemetry() : nullptr;
}

JobChannel::Wanted RdzvJobChannel::DiagnosticsWanted() const {
  if (wanted_.request == 0 || wanted_.request == posted_) return {};
  return {wanted_.request, wanted_.profile};
}

void RdzvJobChannel::PostDiagnostics(uint64_t id, const std::string& answer_json) {
  posted_ = id;
  if (client_ == nullptr) return;
  if (auto s = client_->PostDiagnostics(id, {node_id_, hostname_, answer_json}); !s.ok()) {
    spdlog::warn("cannot post this node's stacks to the rendezvous: {}", std::string(s.message()));
  }
}

JobChannel::RdzvAddress RdzvJobChannel::Address() const {
  return {client_ != nullptr ? client_->endpoint() : "", run_id_, token_};
}

}  // namespace dlrun::launcher
