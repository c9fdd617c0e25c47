// The capture window of `dlrun --profile nsys --profile-steps A:B` in a C++ worker (nvtx_ranges.cc);
// here so that a test can drive one with its own start and stop.
#pragma once

#include <cstdint>

namespace dlrun::worker {

class ProfileCapture {
 public:
  using Toggle = int (*)();  // cudaProfilerStart / cudaProfilerStop
  // `tool` and `steps`: contract::kProfile and kProfileSteps ("A:B"). Captures only for nsys
  // with a valid range and both functions present.
  ProfileCapture(const char* tool, const char* steps, Toggle start, Toggle stop);
  // The process started (init()): starts when A is 0.
  void AtStart();
  // The step record of `step` was sent: starts after step A-1, stops after step B (once).
  void AfterStep(int64_t step);
  bool wanted() const { return wanted_; }

 private:
  void Start();
  Toggle start_;
  Toggle stop_;
  bool wanted_ = false;
  int64_t first_ = 0;
  int64_t last_ = 0;
  bool on_ = false;
  bool done_ = false;
};

}  // namespace dlrun::worker
