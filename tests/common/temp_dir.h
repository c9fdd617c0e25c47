// The one way a test makes a scratch directory: a fresh one under $TEST_TMPDIR (else /tmp),
// named after what it holds. Tests remove what they keep no longer; CI's machine is discarded.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace dlrun::testing {

inline std::string MakeTempDir(const std::string& what = "test") {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/dlrun-" + what + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

}  // namespace dlrun::testing
