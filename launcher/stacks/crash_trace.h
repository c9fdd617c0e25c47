// The faulting frame of a crashed worker (docs/STACKS.md, "Crashes"): a rank that dies of
// SIGSEGV cannot be dumped any more, but it wrote its own stack on its way down, to stderr:
// - Python, through faulthandler (dlrun sets PYTHONFAULTHANDLER=1 unless the user set it):
//     Fatal Python error: Segmentation fault
//     Current thread 0x00007f84633d32c0 (most recent call first):
//       File "/tmp/train.py", line 3 in crash
// - C++ workers of the worker library (dlrun::worker::installCrashTrace(), which init() calls):
//     dlrun::worker: fatal signal SIGSEGV; native frames (most recent call first):
//       #0 /path/libtorch_cpu.so+0x1a2b3c at::native::foo(...)
// The agent reads it from the worker's last stderr bytes.
#pragma once

#include <optional>
#include "absl/strings/string_view.h"

#include "launcher/stacks/stacks.h"

namespace dlrun::launcher {

// The crashing thread's frames, innermost first, from a worker's stderr tail; nullopt when the
// text holds no such trace. Python: the "Current thread" block (else the last one), file, line
// and function. Native: module and offset, and the symbol when the library named one.
std::optional<StackThread> ParseCrashTrace(absl::string_view text);

}  // namespace dlrun::launcher
