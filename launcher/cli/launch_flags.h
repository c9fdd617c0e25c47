// The flags of `dlrun PROGRAM` (torchrun's first, then dlrun's own and the telemetry ones):
// each flag's name, whether it takes a value, the setter that checks the value into
// LaunchOptions, and its help line. ParseLaunchOptions, UsageText and CompletionScript
// (options.h) read this one table.
#pragma once

#include <vector>

#include "launcher/cli/flags.h"
#include "launcher/cli/options.h"

namespace dlrun::launcher {

std::vector<cli::Flag<LaunchOptions>> LaunchFlags();

}  // namespace dlrun::launcher
