// docs/STACKS.md, "Capture before kill".
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dlrun::launcher {

// --capture-before-kill: whether the agent dumps its live workers before it stops a failed
// group. kAuto does where the stacks tell something (a hang, a crash by signal, a collective
// timeout, a lost peer) and skips a plain exception whose traceback is in its error file.
enum class CaptureMode { kAuto, kAlways, kOff };
absl::StatusOr<CaptureMode> ParseCaptureMode(const std::string& v);

}  // namespace dlrun::launcher
