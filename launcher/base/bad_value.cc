#include "launcher/base/bad_value.h"

#include "absl/strings/str_cat.h"

namespace dlrun::launcher {

absl::Status BadValue(const std::string& flag, const std::string& value, const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value '", value, "' for --", flag, ": expected ", expected));
}

}  // namespace dlrun::launcher
