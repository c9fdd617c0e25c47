// Fields of JSON from outside (a tool's output, another node's post, a file, a worker's dump)
// read without throwing: a missing, null or mistyped field is the default.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "nlohmann/json.hpp"

namespace dlrun::launcher {

inline std::string Str(const nlohmann::json& j, const char* key, std::string def = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}

inline bool Bool(const nlohmann::json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

template <typename T>
T Num(const nlohmann::json& j, const char* key, T def) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return def;
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return def;
    const int64_t v = it->get<int64_t>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) return def;
    return static_cast<T>(v);
  }
  return it->get<T>();
}

}  // namespace dlrun::launcher
