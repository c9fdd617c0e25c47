#include "rendezvous/job_channel.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "proto/field_checks.h"
#include "telemetry/telemetry_proto.h"

namespace dlrun::rdzv {
namespace {

using proto::CheckString;

// `dlrun profile`'s request: a tool that attaches, some ranks, a duration the timeout covers.
absl::Status CheckProfileAsk(const v1::ProfileAsk& p, uint32_t timeout_ms) {
  if (p.tool() != "py-spy" && p.tool() != "perf") {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile.tool '", absl::CHexEscape(p.tool().substr(0, 64)), "': expected py-spy or perf"));
  }
  if (p.ranks().empty() || p.ranks_size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.ranks has ", p.ranks_size(), " ranks: expected 1 to 4096"));
  }
  for (uint32_t r : p.ranks()) {
    if (r > 1000000) {
      return absl::InvalidArgumentError(absl::StrCat("profile.ranks holds ", r, ": not a rank"));
    }
  }
  if (p.duration_ms() == 0 || p.duration_ms() >= timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat("profile.duration_ms ", p.duration_ms(),
                                                   ": expected 1 to below timeout_ms (",
                                                   timeout_ms, ")"));
  }
  if (p.args().size() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.args has ", p.args().size(), " bytes: expected at most 1024"));
  }
  return absl::OkStatus();
}

}  // namespace

ChannelHandler::ChannelHandler(Handler& membership)
    : membership_(membership), telemetry_(membership.telemetry()) {}

absl::Status ChannelHandler::Publish(const v1::PublishRequest& req, const std::string& peer,
                                     v1::PublishResponse* resp) {
  if (absl::Status s = membership_.Authorize(req.auth(), peer); !s.ok()) return s;
  if (auto s = CheckString("node_id", req.node_id(), 256, true); !s.ok()) {
    return membership_.Refuse(s, peer);
  }
  if (req.has_telemetry() && telemetry_) {
    // Bad figures are refused, but the node's mailbox is still answered.
    auto parsed = telemetry::TelemetryFromProto(req.telemetry());
    if (parsed.ok()) {
      const std::string host = parsed->hostname;  // before the figures are moved
      telemetry_->Update(req.node_id(), host, *std::move(parsed), membership_.Now());
    } else {
      (void)membership_.Refuse(parsed.status(), peer);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const Collection& c : collections_) {
    if (c.waiting.count(req.node_id())) {
      resp->set_diagnostics_request(c.id);
      if (c.profile) *resp->mutable_profile() = *c.profile;
      break;
    }
  }
  return absl::OkStatus();
}

void ChannelHandler::CollectDiagnostics(const v1::StacksRequest& req, const std::string& peer,
                                        DiagnosticsDone done) {
  if (absl::Status s = membership_.Authorize(req.auth(), peer); !s.ok()) return done(s, {});
  if (req.timeout_ms() == 0 || req.timeout_ms() > 600000) {
    return done(membership_.Refuse(absl::InvalidArgumentError(absl::StrCat(
                                       "timeout_ms ", req.timeout_ms(), ": expected 1 to 600000")),
                                   peer),
                {});
  }
  Collection c;
  if (req.has_profile()) {
    if (absl::Status s = CheckProfileAsk(req.profile(), req.timeout_ms()); !s.ok()) {
      return done(membership_.Refuse(s, peer), {});
    }
    c.profile = req.profile();
  }
  c.waiting = membership_.LiveMembers();
  if (c.waiting.empty()) {
    return done(absl::FailedPreconditionError("no node runs workers in this job now"), {});
  }
  c.deadline = membership_.Now() + std::chrono::milliseconds(req.timeout_ms());
  c.done = std::move(done);
  std::lock_guard<std::mutex> lock(mu_);
  c.id = next_id_++;
  collections_.push_back(std::move(c));
}

absl::Status ChannelHandler::PostDiagnostics(const v1::PostStacksRequest& req,
                                             const std::string& peer) {
  if (absl::Status s = membership_.Authorize(req.auth(), peer); !s.ok()) return s;
  const v1::NodeStacks& n = req.stacks();
  if (auto s = CheckString("node_id", n.node_id(), 256, true); !s.ok()) {
    return membership_.Refuse(s, peer);
  }
  if (auto s = CheckString("hostname", n.hostname(), 256, false); !s.ok()) {
    return membership_.Refuse(s, peer);
  }
  std::vector<std::pair<DiagnosticsDone, v1::StacksResponse>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Collection& c : collections_) {
      if (c.id != req.request_id() || !c.waiting.erase(n.node_id())) continue;
      *c.response.add_nodes() = n;
    }
    finished = Finish(membership_.Now());
  }
  for (auto& [done, resp] : finished) done(absl::OkStatus(), resp);
  return absl::OkStatus();
}

std::optional<TimePoint> ChannelHandler::Tick() {
  std::optional<TimePoint> next;
  std::vector<std::pair<DiagnosticsDone, v1::StacksResponse>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished = Finish(membership_.Now());
    for (const Collection& c : collections_) {
      if (!next || c.deadline < *next) next = c.deadline;
    }
  }
  for (auto& [done, resp] : finished) done(absl::OkStatus(), resp);
  return next;
}

std::vector<std::pair<ChannelHandler::DiagnosticsDone, v1::StacksResponse>>
ChannelHandler::Finish(TimePoint now) {
  std::vector<std::pair<DiagnosticsDone, v1::StacksResponse>> out;
  for (auto it = collections_.begin(); it != collections_.end();) {
    if (!it->waiting.empty() && now < it->deadline) {
      ++it;
      continue;
    }
    for (const auto& [id, host] : it->waiting) {
      v1::NodeStacks* m = it->response.add_missing();
      m->set_node_id(id);
      m->set_hostname(host);
    }
    out.emplace_back(std::move(it->done), std::move(it->response));
    it = collections_.erase(it);
  }
  return out;
}

}  // namespace dlrun::rdzv
