// Slurm hostlists: "tux[0-5,12]", "node[001-004,007],gpu-a[1-2]", "r[1-2]-n[01-02]".
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::launcher {

// Expands a hostlist in Slurm's order, keeping zero padding. Errors (unbalanced brackets, bad
// ranges, more than `max_hosts`) name the hostlist and what was expected.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(const std::string& hostlist,
                                                        size_t max_hosts = 1 << 20);

}  // namespace dlrun::launcher
