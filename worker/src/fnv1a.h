// FNV-1a 64 over raw bytes, shared by the checkpoint checksum and the parameter digest.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dlrun::worker::detail {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// Continues hash `h` over `n` bytes (start with kFnv1aOffset).
inline uint64_t Fnv1a(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace dlrun::worker::detail
