// A reader of the plain-data Python pickles torch writes (the Flight Recorder's dumps,
// flight_recorder.h), without Python: bounded, and it calls nothing.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace dlrun::launcher {

// The pickle's value as JSON: dict -> object (keys as strings), list/tuple -> array, str and
// bytes -> string, int, float, bool, None -> null. Only what torch's pickler writes for plain
// data (and its build_intlist-style globals); anything else is an error naming the opcode.
absl::StatusOr<nlohmann::json> ReadPickle(std::string_view bytes);

}  // namespace dlrun::launcher
