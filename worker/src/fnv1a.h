// FNV-1a 64 over raw bytes (the checkpoint checksum), and the parameter digest's word hash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dlrun::worker::detail {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;
inline constexpr uint64_t kFnv1aPrime = 1099511628211ull;

// Continues hash `h` over `n` bytes (start with kFnv1aOffset).
inline uint64_t Fnv1a(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnv1aPrime;
  return h;
}

// Continues hash `h` over `n` bytes, 8 at a time in four independent FNV-style lanes (xor a
// word, multiply by the odd prime: each step a bijection, so one differing word always changes
// the result), the lanes and the tail folded in bytewise. About 10x the speed of Fnv1a on the
// 30-90 MB a replica check reads; not the checkpoint format's checksum.
inline uint64_t WordHash(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {h, h ^ 0x9e3779b97f4a7c15ull, h ^ 0xc2b2ae3d27d4eb4full,
                      h ^ 0x165667b19e3779f9ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * kFnv1aPrime;
    }
  }
  h = Fnv1a(lane, sizeof lane, h);
  return Fnv1a(p + i, n - i, h ^ n);
}

}  // namespace dlrun::worker::detail
