// train_unet's YAML configurations (examples/unet/config/UNet.yaml), in the SC22 tutorial's
// shape: named maps that build on each other with anchors and merge keys (`<<: *base`).
// No LibTorch here: unit tests and a fuzz target (tests/fuzz/yaml_config_fuzz.cc) use it alone.
#pragma once

#include <map>
#include <string>

#include "worker/src/text.h"

namespace dlrun::examples {

// The flattened configuration `name` of `path`: key -> scalar text; nested maps become
// "outer.inner" (e.g. "lr_schedule.start_lr"). Errors name the file, the configuration and the
// problem (missing file, unknown configuration, bad YAML).
lite::StatusOr<std::map<std::string, std::string>> LoadConfig(const std::string& path,
                                                              const std::string& name);

// The same from YAML text; `source` names it in errors (the file's path for LoadConfig).
// Merge keys take a map or a list of maps (earlier maps win, the node's own keys over all);
// keys must be scalars; lists as values are ignored; nesting (merges included) deeper than
// kMaxConfigDepth, e.g. an anchor merged into itself, is an error.
lite::StatusOr<std::map<std::string, std::string>> ParseConfig(const std::string& yaml,
                                                               const std::string& name,
                                                               const std::string& source);

inline constexpr int kMaxConfigDepth = 32;

// Where `--config NAME` looks when no --yaml-config is given, from any working directory: for
// the program at `exe`, EXE_DIR/../share/dlrun/unet/UNet.yaml (the build tree and an install
// both have it), else examples/unet/config/UNet.yaml under the working directory.
std::string DefaultConfigFile(const std::string& exe);

}  // namespace dlrun::examples
