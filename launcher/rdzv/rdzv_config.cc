#include "launcher/rdzv/rdzv_config.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "launcher/cli/flags.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

absl::Status BadKey(const std::string& key, const std::string& value, const std::string& expected) {
  return absl::InvalidArgumentError(absl::StrCat("invalid value '", value, "' for ", key,
                                                 " in --rdzv-conf: expected ", expected));
}

absl::Status Seconds(const std::string& key, const std::string& value, rdzv::Duration* out) {
  auto d = cli::ParseDuration("rdzv-conf", value, /*allow_zero=*/false);
  if (!d.ok()) return BadKey(key, value, "seconds > 0");
  *out = *d;
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyRdzvConf(const std::string& conf, rdzv::Config* config, std::string* is_host) {
  auto items = cli::ParseKeyValues("rdzv-conf", conf);
  if (!items.ok()) return items.status();
  std::optional<rdzv::Duration> heartbeat_timeout;
  for (const auto& [k, v] : *items) {
    absl::Status s;
    rdzv::Duration d;
    if (k == "join_timeout") {
      s = Seconds(k, v, &config->join_timeout);
    } else if (k == "last_call_timeout") {
      s = Seconds(k, v, &config->last_call);
    } else if (k == "heartbeat_interval" || k == "keep_alive_interval") {
      s = Seconds(k, v, &config->heartbeat_interval);
    } else if (k == "heartbeat_timeout") {  // torchrun: silent this long = dead
      s = Seconds(k, v, &d);
      heartbeat_timeout = d;
    } else if (k == "close_timeout" || k == "read_timeout" || k == "timeout") {
      s = Seconds(k, v, &d);  // accepted for torchrun compatibility
    } else if (k == "heartbeat_misses" || k == "keep_alive_max_attempt") {
      if (!absl::SimpleAtoi(v, &config->heartbeat_misses) || config->heartbeat_misses < 1) {
        s = BadKey(k, v, "an integer >= 1");
      }
    } else if (k == "store_type" || k == "use_libuv" || k == "protocol" || k == "cacert" ||
               k == "cert" || k == "key") {
      spdlog::info("--rdzv-conf {}={}: torchrun's c10d/etcd setting, no effect with dlrun's "
                   "rendezvous",
                   k, v);
    } else if (k == "is_host") {
      if (v == "1" || v == "true" || v == "True") {
        *is_host = "true";
      } else if (v == "0" || v == "false" || v == "False") {
        *is_host = "false";
      } else {
        s = BadKey(k, v, "true or false");
      }
    } else {
      s = absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", k, "' in --rdzv-conf: expected join_timeout, last_call_timeout, "
          "close_timeout, read_timeout, heartbeat_interval (keep_alive_interval), "
          "heartbeat_misses (keep_alive_max_attempt), heartbeat_timeout or is_host"));
    }
    if (!s.ok()) return s;
  }
  if (heartbeat_timeout) {  // as many intervals as fit, at least one
    const auto n = (heartbeat_timeout->count() + config->heartbeat_interval.count() - 1) /
                   config->heartbeat_interval.count();
    config->heartbeat_misses = static_cast<int>(std::max<int64_t>(1, n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobToken(const EnvLookup& env, const std::string& run_id) {
  const std::optional<std::string> token = env(contract::kRdzvToken);
  if (!token.has_value() || token->empty()) {
    spdlog::warn("{} is unset: any agent that knows the run id can join; set it to a secret "
                 "shared by the job's nodes",
                 contract::kRdzvToken);
    return absl::StrCat("run-id:", run_id);
  }
  if (token->size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(contract::kRdzvToken, " has ", token->size(),
                     " characters: expected a secret of at least 8, the same on every node"));
  }
  return *token;
}

}  // namespace dlrun::launcher
