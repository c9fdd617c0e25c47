// The line of a test program that carries a marker comment, for tests that check where dlrun
// says a rank is ("hang_probe.py:28").
#pragma once

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace dlrun::testing {

// The line of `file` that carries `marker` (a comment at its end, or on the line before it when
// the comment ends with ':'), as "BASENAME:N"; a test failure and "" when no line has it.
inline std::string MarkedLine(const std::string& file, const std::string& marker) {
  std::ifstream in(file);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find(marker) == std::string::npos) continue;
    return file.substr(file.rfind('/') + 1) + ":" +
           std::to_string(!line.empty() && line.back() == ':' ? n + 1 : n);
  }
  ADD_FAILURE() << "no '" << marker << "' in " << file;
  return "";
}

}  // namespace dlrun::testing
