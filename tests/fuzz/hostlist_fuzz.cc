// libFuzzer: Slurm hostlists. Must return an expansion or an error, never crash or blow up.
#include <cstddef>
#include <cstdint>
#include <string>

#include "launcher/detect/hostlist.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  auto hosts = dlrun::launcher::ExpandHostlist(s);
  if (hosts.ok()) {
    for (const auto& h : *hosts) {
      if (h.empty()) __builtin_trap();  // an expansion never yields an empty host name
    }
  }
  return 0;
}
