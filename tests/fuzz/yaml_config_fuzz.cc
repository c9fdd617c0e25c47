// libFuzzer target: train_unet's YAML config loader on arbitrary text (seed corpus:
// examples/unet/config/UNet.yaml). It must return a value or a one-line error; crashes, hangs
// (alias cycles), uncaught exceptions and multi-line errors are findings.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "unet/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const char* name : {"short", "base", "c"}) {
    auto cfg = dlrun::examples::ParseConfig(text, name, "fuzz.yaml");
    if (!cfg.ok() && cfg.status().message().find('\n') != std::string::npos &&
        text.find('\n') == std::string::npos) {
      std::abort();  // a newline in the error that the input did not supply
    }
  }
  return 0;
}
