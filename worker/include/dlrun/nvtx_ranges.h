// NVTX ranges on the "dlrun" domain, for nsys (and any NVTX tool), and the capture window of
// `dlrun --profile nsys --profile-steps A:B`. No LibTorch, no NVTX header here: the library is
// built with NVTX3 (header-only, from the CUDA toolkit or PyPI's nvidia-nvtx) when it finds it;
// without it every call is an empty function. With no tool attached, NVTX's own calls are a load
// and a branch each (bench/RESULTS.md, "NVTX ranges").
//
// dlrun::worker opens "allreduce bucket" (payload: the bucket's index; from its launch to the
// end of its reduction), "broadcast buffers", "checkpoint save" and "checkpoint load" itself;
// train_unet adds "step" (payload: the step), "data wait", "forward", "backward" and
// "optimizer step". Names must be string literals (or live as long as the process).
#pragma once

#include <cstdint>

namespace dlrun::worker {

// A range pushed at construction and popped at destruction, on this thread.
class ScopedRange {
 public:
  explicit ScopedRange(const char* name) noexcept;
  // With a number shown beside the name (nsys: the payload), e.g. the step.
  ScopedRange(const char* name, int64_t payload) noexcept;
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;
};

// A range that may end on another thread than the one that started it (an asynchronous
// collective). start_range returns its id (0 when there is no tool or no NVTX); end_range(0) is a
// no-op.
uint64_t start_range(const char* name, int64_t payload) noexcept;
void end_range(uint64_t id) noexcept;

// Whether this build of dlrun::worker has NVTX compiled in.
bool nvtx_compiled_in() noexcept;

// `dlrun --profile nsys --profile-steps A:B` (DLRUN_PROFILE=nsys and DLRUN_PROFILE_STEPS in the
// environment): calls cudaProfilerStart after the step record of step A-1 (or at init() when
// A is 0) and cudaProfilerStop after the record of step B, once per process, so that
// `nsys --capture-range=cudaProfilerApi` captures steps A to B. report_step() and init() call
// these; a trainer that reports its steps needs nothing more. cudaProfilerStart/Stop are looked
// up in the process (the CUDA runtime LibTorch loaded): without CUDA nothing happens.
void profile_capture_at_start() noexcept;
void profile_capture_after_step(int64_t step) noexcept;

}  // namespace dlrun::worker
