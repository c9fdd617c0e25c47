// A C++ worker that crashes: the worker library's crash trace (install_crash_trace()) writes its
// native frames, for DlrunStacks.ACxxWorkersSegfaultIsNamedAtItsFaultingFrame.
#include <cstdio>

#include "dlrun/agent_link.h"

namespace {

volatile int* volatile target = nullptr;

[[gnu::noinline]] void CrashProbeWritesThroughNull(int v) {
  *target = v;  // the faulting line
}

}  // namespace

int main() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer reports the bad store itself (UBSan's null check, ASan's SEGV handler) and
  // exits 1 before any SIGSEGV handler of the library's could run: nothing to test here.
  std::fprintf(stderr, "crash_probe: no crash trace installed (built with a sanitizer)\n");
  return 3;
#endif
  if (!dlrun::worker::install_crash_trace()) {
    std::fprintf(stderr, "crash_probe: no crash trace installed\n");
    return 3;
  }
  CrashProbeWritesThroughNull(42);
  return 0;
}
