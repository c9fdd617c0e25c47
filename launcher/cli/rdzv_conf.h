// The rendezvous settings that an agent's --rdzv-conf and `dlrun rdzv-server`'s flags both set:
// one table of keys (torchrun's --rdzv-conf names, each with its rdzv-server flag where it has
// one), parsed once, at the command line, into RdzvConf.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/cli/flags.h"
#include "rendezvous/types.h"

namespace dlrun::launcher {

struct RdzvConf {
  std::optional<rdzv::Duration> join_timeout, last_call, heartbeat_interval;
  std::optional<rdzv::Duration> heartbeat_timeout;  // torchrun's: becomes heartbeat_misses
  std::optional<int> heartbeat_misses;
  std::string is_host = "auto";  // "auto", "true" or "false"
  // Sets on `config` what was given (heartbeat_timeout: as many intervals as fit, at least one).
  void ApplyTo(rdzv::Config* config) const;
};

// --rdzv-conf "key=value,...". Keys: join_timeout, last_call_timeout, heartbeat_interval
// (seconds; torchrun's keep_alive_interval), heartbeat_misses (keep_alive_max_attempt),
// heartbeat_timeout (seconds), is_host (true/false); torchrun's close_timeout, read_timeout,
// timeout, store_type, use_libuv and the etcd keys are accepted and have no effect.
absl::StatusOr<RdzvConf> ParseRdzvConf(const std::string& conf);

// dlrun rdzv-server's flags for the same keys (--last-call, --join-timeout,
// --heartbeat-interval, --heartbeat-misses), setting (o.*field).
template <typename Opts>
void AddRdzvConfFlags(RdzvConf Opts::*field, std::vector<cli::Flag<Opts>>* flags);

// --- implementation of the template -------------------------------------------------------

// One key: its --rdzv-conf name(s) and rdzv-server flag, and how a value is read.
struct RdzvKey {
  enum class Kind { kSeconds, kCount, kHost, kNoEffect, kForeign };
  std::string key;
  std::vector<std::string> aliases;  // torchrun's other names
  std::string flag;                  // dlrun rdzv-server's flag; "": none
  std::string help;                  // for the flag
  Kind kind = Kind::kNoEffect;
  std::optional<rdzv::Duration> RdzvConf::*seconds = nullptr;
  std::optional<int> RdzvConf::*count = nullptr;
};
const std::vector<RdzvKey>& RdzvKeys();
// Reads `value` for `k` into `conf`; a bad value is reported by `bad(expected)`.
absl::Status SetRdzvKey(const RdzvKey& k, const std::string& value, RdzvConf* conf,
                        const std::function<absl::Status(const std::string&)>& bad);

template <typename Opts>
void AddRdzvConfFlags(RdzvConf Opts::*field, std::vector<cli::Flag<Opts>>* flags) {
  for (const RdzvKey& k : RdzvKeys()) {
    if (k.flag.empty()) continue;
    flags->push_back({k.flag, "", true,
                      [field, &k](Opts& o, const std::string& v) {
                        return SetRdzvKey(k, v, &(o.*field), [&](const std::string& expected) {
                          return cli::BadValue(k.flag, v, expected);
                        });
                      },
                      k.help});
  }
}

}  // namespace dlrun::launcher
