// Fault injection for the checkpoint tests (not installed): `hook` is called after each chunk of
// a checkpoint's temporary file is written, in this process, until reset with {}.
#pragma once

#include <cstddef>
#include <functional>

namespace dlrun::worker::testing_only {
void SetCheckpointWriteHook(std::function<void(size_t bytes_written)> hook);
}  // namespace dlrun::worker::testing_only
