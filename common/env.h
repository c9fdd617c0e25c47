// The environment as a lookup function, so that parsers take a test's map as readily as the
// process's own variables. Shared by the launcher and the worker library.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace dlrun {

using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

// This process's environment (getenv at each call).
EnvLookup ProcessEnvironment();

}  // namespace dlrun
