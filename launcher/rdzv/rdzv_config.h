// The rendezvous configuration as the launcher builds it, for a hosted rendezvous (the agent
// that can bind --rdzv-endpoint) and for `dlrun rdzv-server` alike: one set of defaults
// (rdzv::Config), one --rdzv-conf parser, one token rule.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "launcher/cli/options.h"
#include "rendezvous/types.h"

namespace dlrun::launcher {

// --rdzv-conf "key=value,...". Keys: join_timeout, last_call_timeout, heartbeat_interval
// (seconds; torchrun's keep_alive_interval), heartbeat_misses (keep_alive_max_attempt),
// heartbeat_timeout (seconds: heartbeat_misses becomes as many intervals as fit), is_host
// (true/false); torchrun's close_timeout, read_timeout, timeout, store_type, use_libuv and the
// etcd keys are accepted and have no effect. `is_host` receives "auto", "true" or "false".
absl::Status ApplyRdzvConf(const std::string& conf, rdzv::Config* config, std::string* is_host);

// The job's token, from contract::kRdzvToken. The one rule for every rendezvous: unset or empty
// is allowed with a warning (the token is then derived from the run id, so anyone who knows
// the run id can join); a token that is set must have at least 8 characters.
absl::StatusOr<std::string> JobToken(const EnvLookup& env, const std::string& run_id);

}  // namespace dlrun::launcher
