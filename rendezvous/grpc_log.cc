#include "rendezvous/grpc_log.h"

#include <grpc/support/log.h>

#include <mutex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace dlrun::rdzv {
namespace {

// What gRPC logs when a listening port cannot be bound (1.51's chttp2_server.cc: one line whose
// children name the socket's error): the caller reports that failure itself.
bool IsBindFailure(absl::string_view msg) {
  for (absl::string_view s : {"No address added", "Failed to add", "Address already in use"}) {
    if (absl::StrContains(msg, s)) return true;
  }
  return false;
}

void Log(gpr_log_func_args* args) {
  const std::string msg = args->message != nullptr ? args->message : "";
  if (args->severity == GPR_LOG_SEVERITY_ERROR && !IsBindFailure(msg)) {
    spdlog::warn("grpc: {}", msg);
  } else {
    spdlog::debug("grpc: {} ({}:{})", msg, args->file != nullptr ? args->file : "?", args->line);
  }
}

}  // namespace

void RouteGrpcLog() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(Log); });
}

}  // namespace dlrun::rdzv
