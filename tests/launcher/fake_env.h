// An environment for tests: these variables and nothing else.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/env.h"

namespace dlrun::testing {

inline EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace dlrun::testing
