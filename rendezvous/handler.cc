#include "rendezvous/handler.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "proto/field_checks.h"

namespace dlrun::rdzv {
namespace {

using proto::CheckString;

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::string& longer = a.size() >= b.size() ? a : b;
  for (size_t i = 0; i < longer.size(); ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

void ToProto(const Assignment& a, v1::Assignment* out) {
  out->set_round(a.round);
  out->set_node_rank(a.node_rank);
  out->set_num_nodes(a.num_nodes);
  out->set_rank_offset(a.rank_offset);
  out->set_world_size(a.world_size);
  out->set_local_world_size(a.local_world_size);
  out->set_master_addr(a.master_addr);
  out->set_master_port(a.master_port);
  out->set_restart_count(a.restart_count);
  out->set_recovery_generation(static_cast<uint32_t>(a.recovery_generation));
}

Assignment FromProto(const v1::Assignment& a) {
  Assignment r;
  r.round = a.round();
  r.node_rank = static_cast<int>(a.node_rank());
  r.num_nodes = static_cast<int>(a.num_nodes());
  r.rank_offset = static_cast<int>(a.rank_offset());
  r.world_size = static_cast<int>(a.world_size());
  r.local_world_size = static_cast<int>(a.local_world_size());
  r.master_addr = a.master_addr();
  r.master_port = static_cast<int>(a.master_port());
  r.restart_count = static_cast<int>(a.restart_count());
  r.recovery_generation = static_cast<int>(a.recovery_generation());
  return r;
}

absl::StatusOr<NodeInfo> NodeFromProto(const v1::NodeIdentity& n) {
  if (auto s = CheckString("node.node_id", n.node_id(), 256, true); !s.ok()) return s;
  if (auto s = CheckString("node.hostname", n.hostname(), 255, true); !s.ok()) return s;
  if (auto s = CheckString("node.address", n.address(), 255, true); !s.ok()) return s;
  if (n.nproc() < 1 || n.nproc() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.nproc is ", n.nproc(), " (expected 1-4096)"));
  }
  if (n.master_port() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.master_port is ", n.master_port(), " (expected 0-65535)"));
  }
  if (n.slurm_node_id() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.slurm_node_id is ", n.slurm_node_id(), " (expected >= -1)"));
  }
  NodeInfo out;
  out.node_id = n.node_id();
  out.hostname = n.hostname();
  out.address = n.address();
  out.nproc = static_cast<int>(n.nproc());
  out.slurm_node_id = n.slurm_node_id();
  out.master_port = static_cast<int>(n.master_port());
  if (!std::isfinite(n.preflight_gflops()) || n.preflight_gflops() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node.preflight_gflops is ", n.preflight_gflops(), " (expected a finite figure >= 0)"));
  }
  out.preflight_gflops = n.preflight_gflops();
  out.in_process = n.in_process();
  return out;
}

absl::Status ResumeFromProto(const v1::Resume& r, ResumeInfo* out) {
  if (r.round() == 0) return absl::OkStatus();
  if (auto s = CheckString("resume.lost_host", r.lost_host(), 256, false); !s.ok()) return s;
  if (r.survivors() > 1000000 || r.restart_count() > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat("resume.survivors ", r.survivors(),
                                                   " or resume.restart_count ", r.restart_count(),
                                                   " is out of range (expected at most 1000000)"));
  }
  out->round = r.round();
  out->restart_count = static_cast<int>(r.restart_count());
  out->survivors = static_cast<int>(r.survivors());
  out->lost_host = r.lost_host();
  return absl::OkStatus();
}

namespace {
Config WithFirst(Config c, const std::string& host_node_id) {
  c.first_node_id = host_node_id;
  return c;
}
}  // namespace

Handler::Handler(HandlerOptions options)
    : options_(std::move(options)), machine_(WithFirst(options_.config, options_.host_node_id),
               options_.now()) {}

absl::Status Handler::Refuse(absl::Status s, const std::string& peer) {
  if (options_.on_refused) options_.on_refused(s, peer);
  return s;
}

absl::Status Handler::Authorize(const v1::Auth& auth, const std::string& peer) {
  if (auth.protocol_version() != kProtocolVersion) {
    return Refuse(absl::FailedPreconditionError(absl::StrCat(
                      "rendezvous protocol version ", auth.protocol_version(),
                      " is not supported: this server speaks version ", kProtocolVersion,
                      " (update dlrun on every node to the same release)")),
                  peer);
  }
  if (auth.run_id() != options_.run_id || !ConstantTimeEquals(auth.token(), options_.token)) {
    // One message for both, so a caller cannot probe which one was wrong.
    return Refuse(absl::PermissionDeniedError("wrong run id or job token"), peer);
  }
  if (auth.epoch() > options_.epoch) {
    return Refuse(absl::FailedPreconditionError(absl::StrCat(
                      "stale rendezvous host: it serves epoch ", options_.epoch,
                      " but the caller has seen epoch ", auth.epoch(), " (a newer host took over)")),
                  peer);
  }
  return absl::OkStatus();
}

void Handler::Deliver(Deliveries& d) {
  for (Delivery& x : d) {
    if (x.callback) x.callback(std::move(x.result));
  }
}

void Handler::Join(const v1::JoinRequest& req, const std::string& peer, uint64_t ticket,
                   JoinDone done) {
  static const v1::JoinResponse kEmpty;
  if (absl::Status s = Authorize(req.auth(), peer); !s.ok()) {
    done(s, kEmpty);
    return;
  }
  absl::StatusOr<NodeInfo> node = NodeFromProto(req.node());
  if (node.ok()) {
    if (absl::Status r = ResumeFromProto(req.resume(), &node->resume); !r.ok()) node = r;
  }
  if (!node.ok()) {
    done(Refuse(node.status(), peer), kEmpty);
    return;
  }
  if (req.candidates() != options_.candidates) {
    done(Refuse(absl::InvalidArgumentError(absl::StrCat(
                    "the rendezvous candidate lists disagree: this host has '", options_.candidates,
                    "', node ", req.node().hostname(), " has '", req.candidates(),
                    "' (give every node the same --rdzv-endpoint)")),
                peer),
         kEmpty);
    return;
  }
  std::string redirect;
  {
    std::lock_guard<std::mutex> lock(mu_);
    redirect = redirect_;
  }
  if (!redirect.empty()) {  // this host stepped down: the job goes on elsewhere
    v1::JoinResponse resp;
    resp.set_epoch(options_.epoch);
    resp.set_redirect(redirect);
    done(absl::OkStatus(), resp);
    return;
  }
  // Runs when the round closes. Deliveries run after the lock is released, so it may take it.
  auto cb = [this, done = std::move(done)](absl::StatusOr<Assignment> r) {
    if (!r.ok()) {
      done(r.status(), kEmpty);
      return;
    }
    v1::JoinResponse resp;
    ToProto(*r, resp.mutable_assignment());
    resp.set_epoch(options_.epoch);
    std::vector<Successor> successors;
    {
      std::lock_guard<std::mutex> lock(mu_);
      successors = machine_.members().Successors(options_.host_node_id);
    }
    for (const Successor& x : successors) {
      auto* p = resp.add_successors();
      p->set_node_id(x.node_id);
      p->set_address(x.address);
    }
    done(absl::OkStatus(), resp);
  };
  Deliveries out;
  absl::Status s;
  std::optional<Resize> admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TimePoint now = options_.now();
    if (!options_.host_node_id.empty() && node->node_id == options_.host_node_id) host_heard_ = now;
    s = machine_.Join(*node, ticket, now, cb, &out);
    admitted = machine_.TakeResize();
  }
  Deliver(out);
  if (!s.ok()) cb(s);
  if (admitted && on_resize_) on_resize_(*admitted);
}

void Handler::Admitted(uint64_t round, int generation, int port) {
  Deliveries out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    machine_.Admitted(round, generation, port, &out);
  }
  Deliver(out);
}

bool Handler::CancelJoin(const std::string& node_id, uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return machine_.CancelJoin(node_id, ticket);
}

absl::Status Handler::Heartbeat(const v1::HeartbeatRequest& req, const std::string& peer,
                                v1::HeartbeatResponse* resp) {
  if (absl::Status s = Authorize(req.auth(), peer); !s.ok()) return s;
  if (auto s = CheckString("node_id", req.node_id(), 256, true); !s.ok()) return Refuse(s, peer);
  absl::StatusOr<HeartbeatReply> r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!redirect_.empty()) {
      resp->set_action(v1::HeartbeatResponse::RESTART);
      resp->set_current_round(machine_.state().round);
      resp->set_epoch(options_.epoch);
      resp->set_redirect(redirect_);
      resp->set_reason(absl::StrCat("the rendezvous moved to a newer host at ", redirect_));
      return absl::OkStatus();
    }
    const TimePoint now = options_.now();
    if (!options_.host_node_id.empty() && req.node_id() == options_.host_node_id) host_heard_ = now;
    r = machine_.Heartbeat(req.node_id(), req.round(), now, req.in_process());
  }
  if (!r.ok()) return Refuse(r.status(), peer);
  resp->set_epoch(options_.epoch);
  switch (r->action) {
    case Action::kContinue: resp->set_action(v1::HeartbeatResponse::CONTINUE); break;
    case Action::kRestart: resp->set_action(v1::HeartbeatResponse::RESTART); break;
    case Action::kStop: resp->set_action(v1::HeartbeatResponse::STOP); break;
    case Action::kFinished: resp->set_action(v1::HeartbeatResponse::FINISHED); break;
  }
  resp->set_current_round(r->current_round);
  resp->set_reason(r->reason);
  return absl::OkStatus();
}

absl::Status Handler::ReportFailure(const v1::FailureReport& req, const std::string& peer,
                                    v1::FailureResponse* resp) {
  if (absl::Status s = Authorize(req.auth(), peer); !s.ok()) return s;
  if (auto s = CheckString("node_id", req.node_id(), 256, true); !s.ok()) return Refuse(s, peer);
  if (req.reason().size() > 4096) {
    return Refuse(absl::InvalidArgumentError("reason is longer than 4096 bytes"), peer);
  }
  Deliveries out;
  absl::StatusOr<FailureReply> r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r = machine_.ReportFailure(req.node_id(), req.round(), req.reason(), options_.now(), &out,
                               req.fatal(), req.fallback());
  }
  Deliver(out);
  if (!r.ok()) return Refuse(r.status(), peer);
  resp->set_next_round(r->next_round);
  resp->set_restarts_exhausted(r->restarts_exhausted);
  return absl::OkStatus();
}

absl::Status Handler::Leave(const v1::LeaveRequest& req, const std::string& peer) {
  if (absl::Status s = Authorize(req.auth(), peer); !s.ok()) return s;
  if (auto s = CheckString("node_id", req.node_id(), 256, true); !s.ok()) return Refuse(s, peer);
  Deliveries out;
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = machine_.Leave(req.node_id(), req.round(), req.success(), options_.now(), &out);
  }
  Deliver(out);
  return s.ok() ? s : Refuse(s, peer);
}

absl::Status Handler::Status(const v1::StatusRequest& req, const std::string& peer,
                             v1::StatusResponse* resp) {
  if (absl::Status s = Authorize(req.auth(), peer); !s.ok()) return s;
  StatusSnapshot snap;
  std::string redirect;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snap = machine_.Snapshot();
    redirect = redirect_;
  }
  resp->set_round(snap.round);
  resp->set_state(snap.phase);
  resp->set_joined(snap.joined);
  resp->set_waiting(snap.waiting);
  resp->set_restart_count(snap.restart_count);
  for (auto& n : snap.nodes) resp->add_nodes(n);
  resp->set_epoch(options_.epoch);
  resp->set_redirect(redirect);
  return absl::OkStatus();
}

bool Handler::StepDown(const std::string& endpoint, uint64_t epoch) {
  if (epoch <= options_.epoch || endpoint.empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!redirect_.empty()) return false;
  redirect_ = endpoint;
  return true;
}

void Handler::WatchEnded(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  machine_.WatchEnded(node_id, options_.now());
}

void Handler::Heard(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  machine_.Heard(node_id, options_.now());
}

std::optional<TimePoint> Handler::Tick() {
  Deliveries out;
  std::optional<TimePoint> next;
  std::optional<Resize> resize;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TimePoint now = options_.now();
    // The hosting agent runs in this process: if even its heartbeats stopped for the liveness
    // limit, this process was not running (stopped, or a frozen machine), and the others'
    // silence means nothing yet. Give everyone a fresh limit instead of declaring them dead.
    const Duration limit = options_.config.liveness_limit();
    if (host_heard_ && now - *host_heard_ > limit &&
        machine_.state().phase == StateMachine::Phase::kRunning) {
      machine_.ExtendLiveness(now);
      host_heard_ = now;
    }
    machine_.Tick(now, &out);
    resize = machine_.TakeResize();
    next = machine_.NextDeadline();
    if (options_.telemetry) {
      const StateMachine::Standing& st = machine_.state();
      const int world = machine_.members().WorldSize();  // one pass over the members
      const bool changed = st.round != telemetry_round_ || world != telemetry_world_ ||
                           st.restart_count != telemetry_restarts_ ||
                           static_cast<int>(st.phase) != telemetry_phase_;
      if (changed) {
        telemetry_phase_ = static_cast<int>(st.phase);
        if (st.restart_count > telemetry_restarts_) {
          options_.telemetry->AddRestartCause(st.restart_reason);
        }
        telemetry_round_ = st.round;
        telemetry_restarts_ = st.restart_count;
        telemetry_world_ = world;
        options_.telemetry->SetJob(options_.run_id, st.round, world,
                                   static_cast<int>(machine_.members().size()), st.restart_count);
        switch (st.phase) {
          case StateMachine::Phase::kJoining:
            options_.telemetry->SetState(st.restart_count > 0 ? "restarting" : "starting");
            break;
          case StateMachine::Phase::kRunning: options_.telemetry->SetState("running"); break;
          case StateMachine::Phase::kFailed: options_.telemetry->SetState("failed"); break;
          case StateMachine::Phase::kSucceeded: options_.telemetry->SetState("succeeded"); break;
        }
      }
    }
  }
  Deliver(out);
  if (resize && on_resize_) on_resize_(*resize);
  return next;
}

std::map<std::string, std::string> Handler::LiveMembers() {
  std::lock_guard<std::mutex> lock(mu_);
  return machine_.members().Live();
}

bool Handler::EndAcknowledged() {
  std::lock_guard<std::mutex> lock(mu_);
  return machine_.EndAcknowledged();
}

StateMachine::Phase Handler::phase() {
  std::lock_guard<std::mutex> lock(mu_);
  return machine_.state().phase;
}

uint64_t Handler::round() {
  std::lock_guard<std::mutex> lock(mu_);
  return machine_.state().round;
}

}  // namespace dlrun::rdzv
