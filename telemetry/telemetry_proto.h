// NodeTelemetry <-> its proto message (proto/rendezvous.proto), the one place a telemetry field
// crosses the wire: a new field is one proto field, one struct member (telemetry.h), one line
// each way here, and its use. Incoming messages are checked: each bad field is a one-line error.
#pragma once

#include "absl/status/statusor.h"
#include "dlrun/proto/rendezvous.pb.h"
#include "telemetry/telemetry.h"

namespace dlrun::telemetry {

void ToProto(const NodeTelemetry& t, dlrun::rdzv::v1::NodeTelemetry* out);
absl::StatusOr<NodeTelemetry> TelemetryFromProto(const dlrun::rdzv::v1::NodeTelemetry& t);

}  // namespace dlrun::telemetry
