// A C++ worker that crashes: the worker library's crash trace (installCrashTrace()) writes its
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
  if (!dlrun::worker::installCrashTrace()) {
    std::fprintf(stderr, "crash_probe: no crash trace installed\n");
    return 3;
  }
  CrashProbeWritesThroughNull(42);
  return 0;
}
