// What a worker tells its agent. No LibTorch here.
#pragma once

#include <string>

namespace dlrun::worker {

// Tells the dlrun agent this worker is making progress (its --hang-timeout clock restarts).
// Cheap and non-blocking; call it once per training step. A no-op outside dlrun.
void heartbeat();

// Writes the torchelastic error file ($TORCHELASTIC_ERROR_FILE) with `message`, so dlrun (or
// torchrun) names it as the root cause. A no-op when the variable is unset.
void recordError(const std::string& message);

}  // namespace dlrun::worker
