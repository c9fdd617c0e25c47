// libFuzzer: the step records a worker writes on its heartbeat pipe (docs/TELEMETRY.md). Any
// bytes, split at any point, must give records with sane fields or a count of bad ones, never
// a crash or unbounded memory.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "launcher/workers/step_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dlrun::launcher::StepRecord;
  dlrun::launcher::StepRecordReader reader;
  std::vector<StepRecord> out;
  const char* p = reinterpret_cast<const char*>(data);
  const size_t split = size == 0 ? 0 : data[0] % (size + 1);  // two reads, split anywhere
  reader.Feed(p, split, &out);
  reader.Feed(p + split, size - split, &out);
  for (const StepRecord& r : out) {
    if (r.step < 0 || r.samples < 0 || !(r.step_s >= 0) || !std::isfinite(r.step_s)) {
      __builtin_trap();
    }
    if (r.data_s && !(*r.data_s >= 0)) __builtin_trap();
    if (r.loss && !std::isfinite(*r.loss)) __builtin_trap();
  }
  if (reader.bad() < 0 || out.size() > size) __builtin_trap();
  return 0;
}
