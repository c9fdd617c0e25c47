#include "telemetry/telemetry_proto.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/field_checks.h"

namespace dlrun::telemetry {
namespace {

namespace v1 = dlrun::rdzv::v1;
using absl::InvalidArgumentError;
using proto::CheckString;
using proto::Finite;

int64_t Clamp62(uint64_t v) { return static_cast<int64_t>(std::min<uint64_t>(v, 1ull << 62)); }

void ToProto(const RestartCost& c, v1::RestartCost* x) {
  x->set_restart(c.restart);
  x->set_restarts(static_cast<uint32_t>(std::max(0, c.restarts)));
  x->set_detection_s(c.detection_s);
  x->set_stop_s(c.stop_s);
  x->set_rendezvous_s(c.rendezvous_s);
  x->set_start_s(c.start_s);
  x->set_checkpoint_load_s(c.checkpoint_load_s);
  x->set_recomputed_s(c.recomputed_s);
  x->set_recomputed_steps(static_cast<uint64_t>(std::max<int64_t>(0, c.recomputed_steps)));
  x->set_fault_step(c.fault_step);
  x->set_resumed_step(c.resumed_step);
  x->set_resumed(c.resumed);
  x->set_state_from_peer_s(c.state_from_peer_s);
  x->set_in_process(c.in_process);
  x->set_admission(c.admission);
  x->set_generation(static_cast<uint32_t>(c.generation));
  x->set_in_process_tries(static_cast<uint32_t>(std::max(0, c.in_process_tries)));
  x->set_started_forked(static_cast<uint32_t>(std::max(0, c.started_forked)));
  x->set_started_spare(static_cast<uint32_t>(std::max(0, c.started_spare)));
  x->set_started_cold(static_cast<uint32_t>(std::max(0, c.started_cold)));
}

void ToProto(const RankProfile& p, v1::RankProfile* x) {
  x->set_rank(static_cast<uint32_t>(p.rank));
  x->set_tool(p.tool);
  x->set_path(p.path);
  x->set_note(p.note);
  x->set_samples(static_cast<uint64_t>(std::max<int64_t>(0, p.samples)));
  for (const auto& [frame, fraction] : p.hot) {
    v1::ProfileHotFrame* h = x->add_hot();
    h->set_frame(frame);
    h->set_fraction(fraction);
  }
}

void ToProto(const RankTelemetry& r, v1::RankTelemetry* x) {
  x->set_rank(static_cast<uint32_t>(r.rank));
  x->set_local_rank(static_cast<uint32_t>(r.local_rank));
  x->set_steps(static_cast<uint64_t>(r.steps));
  x->set_samples(static_cast<uint64_t>(r.samples));
  x->set_step_seconds(r.step_s);
  x->set_data_seconds(r.data_s);
  x->set_compute_seconds(r.compute_s);
  x->set_sync_seconds(r.sync_s);
  x->set_flags((r.has_data ? 1u : 0u) | (r.has_split ? 2u : 0u) | (r.loss ? 4u : 0u));
  x->set_step_p50_s(static_cast<float>(r.step_p50_s));
  x->set_step_p95_s(static_cast<float>(r.step_p95_s));
  if (r.loss) x->set_loss(*r.loss);
  x->set_cpu_utilization(r.cpu_utilization ? static_cast<float>(*r.cpu_utilization) : -1.0f);
  x->set_cpu_s(r.cpu_s);
  x->set_rss_bytes(static_cast<uint64_t>(r.rss_bytes));
  x->set_rss_peak_bytes(static_cast<uint64_t>(r.rss_peak_bytes));
  x->set_gpu_memory_bytes(r.gpu_memory_bytes);
}

absl::StatusOr<RestartCost> FromProto(const v1::RestartCost& x) {
  for (double v : {x.detection_s(), x.stop_s(), x.rendezvous_s(), x.start_s(),
                   x.checkpoint_load_s(), x.recomputed_s(), x.state_from_peer_s()}) {
    if (!Finite(v) || v > 1e9) {
      return InvalidArgumentError(absl::StrCat("telemetry of restart ", x.restart(),
                                               " has a phase of ", v,
                                               " s (expected a finite number, 0 to 1e9)"));
    }
  }
  if (x.restart() < -1 || x.restarts() > (1u << 24) || x.recomputed_steps() >= (1ull << 62) ||
      x.fault_step() < -1 || x.resumed_step() < -1 || x.generation() > (1u << 24) ||
      x.in_process_tries() > x.restarts()) {
    return InvalidArgumentError(absl::StrCat(
        "telemetry restart ", x.restart(), " (", x.restarts(), " restarts, ", x.recomputed_steps(),
        " steps recomputed, fault at step ", x.fault_step(), ", resumed at ", x.resumed_step(),
        ", generation ", x.generation(), ", ", x.in_process_tries(),
        " in-process tries) is out of range"));
  }
  RestartCost c;
  c.restart = x.restart();
  c.restarts = static_cast<int>(x.restarts());
  c.detection_s = x.detection_s();
  c.stop_s = x.stop_s();
  c.rendezvous_s = x.rendezvous_s();
  c.start_s = x.start_s();
  c.checkpoint_load_s = x.checkpoint_load_s();
  c.recomputed_s = x.recomputed_s();
  c.recomputed_steps = static_cast<int64_t>(x.recomputed_steps());
  c.fault_step = x.fault_step();
  c.resumed_step = x.resumed_step();
  c.resumed = x.resumed();
  c.state_from_peer_s = x.state_from_peer_s();
  c.in_process = x.in_process();
  c.admission = x.admission();
  c.generation = static_cast<int>(x.generation());
  c.in_process_tries = static_cast<int>(x.in_process_tries());
  c.started_forked = static_cast<int>(std::min<uint32_t>(x.started_forked(), 1u << 20));
  c.started_spare = static_cast<int>(std::min<uint32_t>(x.started_spare(), 1u << 20));
  c.started_cold = static_cast<int>(std::min<uint32_t>(x.started_cold(), 1u << 20));
  return c;
}

absl::StatusOr<RankProfile> FromProto(const v1::RankProfile& x) {
  const std::string field = absl::StrCat("telemetry.profiles[rank ", x.rank(), "]");
  if (x.rank() >= (1u << 24)) {
    return InvalidArgumentError(absl::StrCat(field, " is out of range (expected below 2^24)"));
  }
  if (auto s = CheckString(field + ".tool", x.tool(), 16, true); !s.ok()) return s;
  if (auto s = CheckString(field + ".path", x.path(), 4096, false); !s.ok()) return s;
  if (auto s = CheckString(field + ".note", x.note(), 512, false); !s.ok()) return s;
  if (static_cast<size_t>(x.hot_size()) > kMaxProfileHotFrames) {
    return InvalidArgumentError(absl::StrCat(field, " has ", x.hot_size(),
                                             " hot frames (expected at most ",
                                             kMaxProfileHotFrames, ")"));
  }
  RankProfile p;
  p.rank = static_cast<int>(x.rank());
  p.tool = x.tool();
  p.path = x.path();
  p.note = x.note();
  if (x.samples() > (1ULL << 40)) {
    return InvalidArgumentError(absl::StrCat(field, ".samples is ", x.samples(),
                                             " (expected below 2^40)"));
  }
  p.samples = static_cast<int64_t>(x.samples());
  for (const v1::ProfileHotFrame& h : x.hot()) {
    if (auto s = CheckString(field + ".hot.frame", h.frame(), 512, true); !s.ok()) return s;
    if (!Finite(h.fraction()) || h.fraction() > 1) {
      return InvalidArgumentError(absl::StrCat(field, ".hot.fraction is ", h.fraction(),
                                               " (expected 0 to 1)"));
    }
    p.hot.emplace_back(h.frame(), h.fraction());
  }
  return p;
}

absl::StatusOr<RankTelemetry> FromProto(const v1::RankTelemetry& x) {
  for (double v : {x.step_seconds(), x.data_seconds(), x.compute_seconds(), x.sync_seconds(), x.cpu_s(),
                   static_cast<double>(x.step_p50_s()), static_cast<double>(x.step_p95_s())}) {
    if (!Finite(v)) {
      return InvalidArgumentError(absl::StrCat("telemetry of rank ", x.rank(), " has a time of ",
                                               v, " (expected a finite number >= 0)"));
    }
  }
  if (x.rank() >= (1u << 24) || x.steps() >= (1ull << 62) || x.samples() >= (1ull << 62)) {
    return InvalidArgumentError(absl::StrCat("telemetry rank ", x.rank(), " with ", x.steps(),
                                             " steps and ", x.samples(),
                                             " samples is out of range"));
  }
  if (!std::isfinite(x.cpu_utilization()) || x.cpu_utilization() > 4096) {
    return InvalidArgumentError(absl::StrCat("telemetry of rank ", x.rank(),
                                             " has a CPU utilization of ", x.cpu_utilization(),
                                             " (expected 0 to 4096 cores, or negative: none)"));
  }
  RankTelemetry r;
  r.rank = static_cast<int>(x.rank());
  r.local_rank = static_cast<int>(x.local_rank() & 0xffffff);
  r.steps = static_cast<int64_t>(x.steps());
  r.samples = static_cast<int64_t>(x.samples());
  r.step_s = x.step_seconds();
  r.data_s = x.data_seconds();
  r.compute_s = x.compute_seconds();
  r.sync_s = x.sync_seconds();
  r.has_data = (x.flags() & 1u) != 0;
  r.has_split = (x.flags() & 2u) != 0;
  if ((x.flags() & 4u) != 0 && std::isfinite(x.loss())) r.loss = x.loss();
  r.step_p50_s = x.step_p50_s();
  r.step_p95_s = x.step_p95_s();
  if (x.cpu_utilization() >= 0) r.cpu_utilization = x.cpu_utilization();
  r.cpu_s = x.cpu_s();
  r.rss_bytes = Clamp62(x.rss_bytes());
  r.rss_peak_bytes = Clamp62(x.rss_peak_bytes());
  r.gpu_memory_bytes = x.gpu_memory_bytes() < 0 ? -1 : x.gpu_memory_bytes();
  return r;
}

absl::StatusOr<GpuTelemetry> FromProto(const v1::GpuTelemetry& x) {
  if (!std::isfinite(x.utilization()) || x.utilization() < 0 || x.utilization() > 1) {
    return InvalidArgumentError(absl::StrCat("telemetry of GPU ", x.index(),
                                             " has a utilization of ", x.utilization(),
                                             " (expected 0 to 1)"));
  }
  GpuTelemetry g;
  g.index = static_cast<int>(x.index() & 0xffff);
  g.utilization = x.utilization();
  g.memory_used_bytes = Clamp62(x.memory_used_bytes());
  g.memory_total_bytes = Clamp62(x.memory_total_bytes());
  return g;
}

// A repeated field of at most `max` entries, each converted and checked.
template <class T, class Msg>
absl::Status RepeatedFromProto(const google::protobuf::RepeatedPtrField<Msg>& in, size_t max,
                               const char* what, std::vector<T>* out) {
  if (static_cast<size_t>(in.size()) > max) {
    return InvalidArgumentError(
        absl::StrCat("telemetry has ", in.size(), " ", what, " (expected at most ", max, ")"));
  }
  for (const Msg& x : in) {
    auto v = FromProto(x);
    if (!v.ok()) return v.status();
    out->push_back(*std::move(v));
  }
  return absl::OkStatus();
}

// The node's own scalar fields.
absl::Status NodeFieldsFromProto(const v1::NodeTelemetry& t, NodeTelemetry* out) {
  if (auto s = CheckString("telemetry.hostname", t.hostname(), 255, false); !s.ok()) return s;
  for (const auto& [name, v] : {std::pair<const char*, double>{"telemetry.lost_s", t.lost_s()},
                                {"telemetry.productive_s", t.productive_s()},
                                {"telemetry.agent_cpu_s", t.agent_cpu_s()}}) {
    if (!Finite(v)) {
      return InvalidArgumentError(absl::StrCat(name, " is ", v, " (expected a finite number >= 0)"));
    }
  }
  if (t.stacks_json().size() > kMaxTelemetryStacksBytes) {
    return InvalidArgumentError(absl::StrCat("telemetry.stacks_json has ", t.stacks_json().size(),
                                             " bytes (expected at most ",
                                             kMaxTelemetryStacksBytes, ")"));
  }
  if (!Finite(t.cpus_allocated()) || t.cpus_allocated() > 1e6) {
    return InvalidArgumentError(absl::StrCat("telemetry.cpus_allocated is ", t.cpus_allocated(),
                                             " (expected 0 to 1000000)"));
  }
  for (const auto& [name, v] : {std::pair<const char*, const std::string*>{
                                    "telemetry.memory_limit_source", &t.memory_limit_source()},
                                {"telemetry.cpus_source", &t.cpus_source()},
                                {"telemetry.program", &t.program()}}) {
    if (auto s = CheckString(name, *v, kMaxTelemetryProgramBytes, false); !s.ok()) return s;
  }
  out->productive_s = t.productive_s();
  out->stacks_json = t.stacks_json();
  out->lost_s = t.lost_s();
  out->hostname = t.hostname();
  out->memory_limit_bytes = Clamp62(t.memory_limit_bytes());
  out->cpus_allocated = t.cpus_allocated();
  out->cpus_source = t.cpus_source();
  out->memory_limit_source = t.memory_limit_source();
  out->program = t.program();
  out->agent_cpu_s = t.agent_cpu_s();
  out->warm_spares = t.warm_spares();
  out->spare_rss_peak_bytes = Clamp62(t.spare_rss_peak_bytes());
  return absl::OkStatus();
}

}  // namespace

void ToProto(const NodeTelemetry& t, v1::NodeTelemetry* out) {
  out->set_lost_s(t.lost_s);
  out->set_hostname(t.hostname);
  out->set_memory_limit_bytes(static_cast<uint64_t>(std::max<int64_t>(0, t.memory_limit_bytes)));
  out->set_stacks_json(t.stacks_json);
  out->set_productive_s(t.productive_s);
  out->set_memory_limit_source(t.memory_limit_source);
  out->set_cpus_allocated(t.cpus_allocated);
  out->set_cpus_source(t.cpus_source);
  out->set_program(t.program);
  out->set_agent_cpu_s(t.agent_cpu_s);
  out->set_warm_spares(t.warm_spares);
  out->set_spare_rss_peak_bytes(static_cast<uint64_t>(std::max<int64_t>(0, t.spare_rss_peak_bytes)));
  for (const RestartCost& c : t.restarts) ToProto(c, out->add_restarts());
  for (const RankProfile& p : t.profiles) ToProto(p, out->add_profiles());
  for (const RankTelemetry& r : t.ranks) ToProto(r, out->add_ranks());
  for (const GpuTelemetry& g : t.gpus) {
    v1::GpuTelemetry* x = out->add_gpus();
    x->set_index(static_cast<uint32_t>(g.index));
    x->set_utilization(static_cast<float>(g.utilization));
    x->set_memory_used_bytes(static_cast<uint64_t>(g.memory_used_bytes));
    x->set_memory_total_bytes(static_cast<uint64_t>(g.memory_total_bytes));
  }
}

absl::StatusOr<NodeTelemetry> TelemetryFromProto(const v1::NodeTelemetry& t) {
  NodeTelemetry out;
  // The counts first (a flood is refused before any entry is read), then the entries.
  if (static_cast<size_t>(t.ranks_size()) > kMaxTelemetryRanks) {
    return InvalidArgumentError(absl::StrCat("telemetry has ", t.ranks_size(),
                                             " ranks (expected at most ", kMaxTelemetryRanks, ")"));
  }
  if (static_cast<size_t>(t.gpus_size()) > kMaxTelemetryGpus) {
    return InvalidArgumentError(absl::StrCat("telemetry has ", t.gpus_size(),
                                             " GPUs (expected at most ", kMaxTelemetryGpus, ")"));
  }
  if (auto s = NodeFieldsFromProto(t, &out); !s.ok()) return s;
  if (auto s = RepeatedFromProto(t.restarts(), kMaxRestartCosts, "restarts", &out.restarts);
      !s.ok()) {
    return s;
  }
  if (auto s = RepeatedFromProto(t.profiles(), kMaxTelemetryRanks, "profiles", &out.profiles);
      !s.ok()) {
    return s;
  }
  if (auto s = RepeatedFromProto(t.ranks(), kMaxTelemetryRanks, "ranks", &out.ranks); !s.ok()) {
    return s;
  }
  if (auto s = RepeatedFromProto(t.gpus(), kMaxTelemetryGpus, "GPUs", &out.gpus); !s.ok()) return s;
  return out;
}

}  // namespace dlrun::telemetry
