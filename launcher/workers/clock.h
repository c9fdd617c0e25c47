// The agent's clock: steady time for deadlines, wall time for what it reports. The POSIX
// agent uses SystemClock(); in-process tests drive a fake one (tests/launcher/agent/fakes.h).
#pragma once

#include <chrono>

namespace dlrun::launcher {

using SteadyTime = std::chrono::steady_clock::time_point;
using Millis = std::chrono::milliseconds;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyTime Now() = 0;
  virtual double WallSeconds() = 0;  // seconds since the epoch
};

Clock& SystemClock();

}  // namespace dlrun::launcher
