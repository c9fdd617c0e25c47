// NVTX ranges on the "dlrun" domain, and nsys's capture window over a step range
// (dlrun/nvtx_ranges.h).
#include "dlrun/nvtx_ranges.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "common/contract.h"
#include "profile_capture.h"

#if DLRUN_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace dlrun::worker {

#if DLRUN_HAVE_NVTX
namespace {

// Created on first use. Without a tool NVTX returns a null handle and every call below is a
// load and a branch inside NVTX's inline wrappers.
nvtxDomainHandle_t Domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("dlrun");
  return domain;
}

nvtxEventAttributes_t Attributes(const char* name, int64_t payload, bool with_payload) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  if (with_payload) {
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = payload;
  }
  return a;
}

}  // namespace

ScopedRange::ScopedRange(const char* name) noexcept {
  const nvtxEventAttributes_t a = Attributes(name, 0, false);
  nvtxDomainRangePushEx(Domain(), &a);
}
ScopedRange::ScopedRange(const char* name, int64_t payload) noexcept {
  const nvtxEventAttributes_t a = Attributes(name, payload, true);
  nvtxDomainRangePushEx(Domain(), &a);
}
ScopedRange::~ScopedRange() { nvtxDomainRangePop(Domain()); }

uint64_t start_range(const char* name, int64_t payload) noexcept {
  const nvtxEventAttributes_t a = Attributes(name, payload, true);
  return nvtxDomainRangeStartEx(Domain(), &a);
}
void end_range(uint64_t id) noexcept {
  if (id != 0) nvtxDomainRangeEnd(Domain(), id);
}
bool nvtx_compiled_in() noexcept { return true; }

#else  // no NVTX3 headers at build time

ScopedRange::ScopedRange(const char*) noexcept {}
ScopedRange::ScopedRange(const char*, int64_t) noexcept {}
ScopedRange::~ScopedRange() = default;
uint64_t start_range(const char*, int64_t) noexcept { return 0; }
void end_range(uint64_t) noexcept {}
bool nvtx_compiled_in() noexcept { return false; }

#endif

ProfileCapture::ProfileCapture(const char* tool, const char* steps, Toggle start, Toggle stop)
    : start_(start), stop_(stop) {
  if (tool == nullptr || std::string_view(tool) != "nsys" || steps == nullptr) return;
  long long a = -1, b = -1;
  char tail = 0;
  if (std::sscanf(steps, "%lld:%lld%c", &a, &b, &tail) != 2 || a < 0 || b < a) return;
  first_ = a;
  last_ = b;
  wanted_ = start_ != nullptr && stop_ != nullptr;
}

void ProfileCapture::AtStart() {
  if (wanted_ && !on_ && !done_ && first_ == 0) Start();
}

void ProfileCapture::AfterStep(int64_t step) {
  if (!wanted_ || done_) return;
  if (on_ && step >= last_) {
    on_ = false;
    done_ = true;
    stop_();
  } else if (!on_ && step >= first_ - 1 && step < last_) {
    Start();
  }
}

void ProfileCapture::Start() {
  on_ = true;
  start_();  // its error (no GPU) is not ours to report: nsys sees no capture then
}

namespace {

ProfileCapture::Toggle Lookup(const char* symbol) {
  return reinterpret_cast<ProfileCapture::Toggle>(dlsym(RTLD_DEFAULT, symbol));
}

ProfileCapture& ProcessCapture() {
  static ProfileCapture capture(std::getenv(contract::kProfile), std::getenv(contract::kProfileSteps),
                                Lookup("cudaProfilerStart"), Lookup("cudaProfilerStop"));
  return capture;
}

}  // namespace

void profile_capture_at_start() noexcept { ProcessCapture().AtStart(); }
void profile_capture_after_step(int64_t step) noexcept { ProcessCapture().AfterStep(step); }

}  // namespace dlrun::worker
