// What dlrun::worker's NVTX ranges (dlrun/nvtx_ranges.h) cost with no tool attached: nanoseconds
// per range, pushed and popped (ScopedRange) and started and ended (start_range/end_range, the
// buckets' all-reduce). bench/profile_overhead multiplies it by the ranges of a U-Net step.
//
//   nvtx_cost [iterations]     prints: {"compiled_in": true, "scoped_ns": .., "start_end_ns": ..}
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "dlrun/nvtx_ranges.h"

namespace {

template <typename F>
double NanosPerCall(long n, F f) {
  f(n / 10);  // warm-up: NVTX's first call initializes it
  const auto t = std::chrono::steady_clock::now();
  f(n);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 20000000;
  if (n <= 0) {
    std::fprintf(stderr, "nvtx_cost: iterations '%s' must be a positive count\n", argv[1]);
    return 2;
  }
  volatile int64_t sink = 0;
  const double scoped = NanosPerCall(n, [&](long k) {
    for (long i = 0; i < k; ++i) {
      dlrun::worker::ScopedRange r("forward", i);
      sink = sink + 1;
    }
  });
  const double start_end = NanosPerCall(n, [&](long k) {
    for (long i = 0; i < k; ++i) dlrun::worker::end_range(dlrun::worker::start_range("allreduce bucket", i));
  });
  std::printf("{\"compiled_in\": %s, \"scoped_ns\": %.3f, \"start_end_ns\": %.3f}\n",
              dlrun::worker::nvtx_compiled_in() ? "true" : "false", scoped, start_end);
  return 0;
}
