// libFuzzer: the Flight Recorder dumps dlrun reads after a failure (launcher/stacks/
// flight_recorder.h) are pickles written by the workers. Any bytes must give a value or an
// error, never a crash, a call of anything but torch's list builders, or unbounded memory.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "launcher/stacks/flight_recorder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto v = dlrun::launcher::ReadPickle(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!v.ok() && v.status().message().empty()) __builtin_trap();
  return 0;
}
