#pragma once

#include "absl/status/statusor.h"
#include "rendezvous/api.h"

namespace dlrun::launcher {

// Loads libdlrun_rdzv.so (gRPC, protobuf) on first use: from ../lib/ beside the dlrun
// executable, then beside it, then the system's library path.
absl::StatusOr<rdzv::Api*> LoadRendezvous();

}  // namespace dlrun::launcher
