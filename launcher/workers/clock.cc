#include "launcher/workers/clock.h"

namespace dlrun::launcher {
namespace {

class RealClock final : public Clock {
 public:
  SteadyTime Now() override { return std::chrono::steady_clock::now(); }
  double WallSeconds() override {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

Clock& SystemClock() {
  static RealClock clock;
  return clock;
}

}  // namespace dlrun::launcher
