// train_unet's YAML configurations (examples/unet/config/UNet.yaml), in the SC22 tutorial's
// shape: named maps that build on each other with anchors and merge keys (`<<: *base`).
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace dlrun::examples {

// The flattened configuration `name` of `path`: key -> scalar text; nested maps become
// "outer.inner" (e.g. "lr_schedule.start_lr"). Errors name the file, the configuration and the
// problem (missing file, unknown configuration, bad YAML).
absl::StatusOr<std::map<std::string, std::string>> LoadConfig(const std::string& path,
                                                              const std::string& name);

}  // namespace dlrun::examples
