// libFuzzer: the rendezvous handler and the job channel fed parsed protos, half of them with
// valid credentials so that they reach the state machine (and the telemetry published reaches
// the aggregate). Records: [type byte][len byte][len bytes of proto].
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/handler.h"
#include "rendezvous/job_channel.h"

namespace r = dlrun::rdzv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  r::HandlerOptions o;
  o.config.min_nodes = 1;
  o.config.max_nodes = 3;
  o.run_id = "job";
  o.token = "tok";
  r::TimePoint now = r::TimePoint() + std::chrono::hours(1);
  o.now = [&now] { return now; };
  o.telemetry = std::make_shared<dlrun::telemetry::JobTelemetry>();  // published figures too
  r::Handler h(std::move(o));
  r::ChannelHandler channel(h);
  auto fix_auth = [](dlrun::rdzv::v1::Auth* a, uint8_t type) {
    if (type & 0x80) {
      a->set_protocol_version(r::kProtocolVersion);
      a->set_run_id("job");
      a->set_token("tok");
    }
  };
  size_t i = 0;
  while (i + 2 <= size) {
    const uint8_t type = data[i];
    const size_t len = std::min<size_t>(data[i + 1], size - i - 2);
    const std::string bytes(reinterpret_cast<const char*>(data + i + 2), len);
    i += 2 + len;
    switch (type & 0x7) {
      case 0: {
        dlrun::rdzv::v1::JoinRequest req;
        if (!req.ParseFromString(bytes)) break;
        fix_auth(req.mutable_auth(), type);
        h.Join(req, "fuzz", h.NewTicket(), [](const absl::Status&, const dlrun::rdzv::v1::JoinResponse&) {});
        break;
      }
      case 1: {
        dlrun::rdzv::v1::HeartbeatRequest req;
        if (!req.ParseFromString(bytes)) break;
        fix_auth(req.mutable_auth(), type);
        dlrun::rdzv::v1::HeartbeatResponse resp;
        (void)h.Heartbeat(req, "fuzz", &resp);
        break;
      }
      case 2: {
        dlrun::rdzv::v1::FailureReport req;
        if (!req.ParseFromString(bytes)) break;
        fix_auth(req.mutable_auth(), type);
        dlrun::rdzv::v1::FailureResponse resp;
        (void)h.ReportFailure(req, "fuzz", &resp);
        break;
      }
      case 3: {
        dlrun::rdzv::v1::LeaveRequest req;
        if (!req.ParseFromString(bytes)) break;
        fix_auth(req.mutable_auth(), type);
        (void)h.Leave(req, "fuzz");
        break;
      }
      case 4: {
        dlrun::rdzv::v1::StatusRequest req;
        if (!req.ParseFromString(bytes)) break;
        fix_auth(req.mutable_auth(), type);
        dlrun::rdzv::v1::StatusResponse resp;
        (void)h.Status(req, "fuzz", &resp);
        break;
      }
      case 5: {
        dlrun::rdzv::v1::PublishRequest req;
        if (!req.ParseFromString(bytes)) break;
        fix_auth(req.mutable_auth(), type);
        dlrun::rdzv::v1::PublishResponse resp;
        (void)channel.Publish(req, "fuzz", &resp);
        break;
      }
      case 6: {
        if (type & 0x40) {
          dlrun::rdzv::v1::StacksRequest req;
          if (!req.ParseFromString(bytes)) break;
          fix_auth(req.mutable_auth(), type);
          channel.CollectDiagnostics(req, "fuzz", [](const absl::Status&,
                                                     const dlrun::rdzv::v1::StacksResponse&) {});
        } else {
          dlrun::rdzv::v1::PostStacksRequest req;
          if (!req.ParseFromString(bytes)) break;
          fix_auth(req.mutable_auth(), type);
          (void)channel.PostDiagnostics(req, "fuzz");
        }
        break;
      }
      default:
        now += std::chrono::milliseconds(100 * (1 + len));  // time passes; timers fire
        (void)h.Tick();
        (void)channel.Tick();
    }
  }
  return 0;
}
