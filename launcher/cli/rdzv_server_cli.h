// `dlrun rdzv-server [options]`: the rendezvous on its own (Run:ai, interactive multi-node). Its
// flags are parsed here, by the same layer as every other subcommand; the rendezvous library
// receives the parsed rdzv::HostOptions and parses nothing itself.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/cli/options.h"
#include "rendezvous/api.h"

namespace dlrun::launcher {

struct RdzvServerArgs {
  rdzv::HostOptions host;  // config, run id, token, listen address (TLS is added by the caller)
  bool help = false;
  bool version = false;
};

// Parses the flags after `rdzv-server`; the token comes from the environment (JobToken()).
absl::StatusOr<RdzvServerArgs> ParseRdzvServerArgs(const std::vector<std::string>& args,
                                                   const EnvLookup& env);
std::string RdzvServerUsage();

}  // namespace dlrun::launcher
