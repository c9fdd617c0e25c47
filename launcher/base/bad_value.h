// The one-line error for a bad value, flags and messages alike: "invalid value 'V' for --FLAG:
// expected WHAT".
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dlrun::launcher {

absl::Status BadValue(const std::string& flag, const std::string& value, const std::string& expected);

}  // namespace dlrun::launcher
