// The rendezvous' one token rule, for a hosted rendezvous (the agent that can bind
// --rdzv-endpoint) and `dlrun rdzv-server` alike. Its settings: rdzv::Config (one set of
// defaults) and launcher/cli/rdzv_conf.h (one table of keys for --rdzv-conf and the server).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "rendezvous/types.h"

namespace dlrun::launcher {

// The job's token, from contract::kRdzvToken. The one rule for every rendezvous: unset or empty
// is allowed with a warning (the token is then derived from the run id, so anyone who knows
// the run id can join); a token that is set must have at least 8 characters.
absl::StatusOr<std::string> JobToken(const EnvLookup& env, const std::string& run_id);

}  // namespace dlrun::launcher
