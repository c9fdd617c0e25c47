// Checks of a proto message's fields that every receiver of dlrun's messages shares: a string of
// bounded length without control characters, a finite non-negative number. Each bad field is a
// one-line error naming it and what was expected.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dlrun::proto {

inline absl::Status CheckString(const std::string& field, const std::string& v, size_t max,
                                bool required) {
  if (required && v.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty (expected 1-", max, " bytes)"));
  }
  if (v.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", v.size(), " bytes long (expected at most ", max, ")"));
  }
  for (unsigned char c : v) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(field, " contains a control character"));
    }
  }
  return absl::OkStatus();
}

inline bool Finite(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace dlrun::proto
