#include "launcher/base/capture_mode.h"

#include "absl/strings/str_cat.h"

namespace dlrun::launcher {

absl::StatusOr<CaptureMode> ParseCaptureMode(const std::string& v) {
  if (v == "auto") return CaptureMode::kAuto;
  if (v == "always") return CaptureMode::kAlways;
  if (v == "off") return CaptureMode::kOff;
  return absl::InvalidArgumentError(absl::StrCat("'", v, "': expected auto, always or off"));
}

}  // namespace dlrun::launcher
