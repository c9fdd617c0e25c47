#include "launcher/cli/rdzv_conf.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {

const std::vector<RdzvKey>& RdzvKeys() {
  using K = RdzvKey::Kind;
  static const std::vector<RdzvKey>* keys = [] {
    const rdzv::Config d;
    auto* v = new std::vector<RdzvKey>{
        {"last_call_timeout", {}, "last-call", "seconds a round with MIN nodes stays open for more",
         K::kSeconds, &RdzvConf::last_call},
        {"join_timeout", {}, "join-timeout", "seconds for MIN nodes to join", K::kSeconds,
         &RdzvConf::join_timeout},
        {"heartbeat_interval", {"keep_alive_interval"}, "heartbeat-interval",
         absl::StrCat("seconds between heartbeats (default ", d.heartbeat_interval.count() / 1000.0,
                      ")"),
         K::kSeconds, &RdzvConf::heartbeat_interval},
        {"heartbeat_misses", {"keep_alive_max_attempt"}, "heartbeat-misses",
         absl::StrCat("missed heartbeats before a node is dead (default ", d.heartbeat_misses, ")"),
         K::kCount, nullptr, &RdzvConf::heartbeat_misses},
        {"heartbeat_timeout", {}, "", "", K::kSeconds, &RdzvConf::heartbeat_timeout},
        {"is_host", {}, "", "", K::kHost},
        // torchrun's, accepted: the c10d backend's timeouts, and settings of its stores.
        {"close_timeout", {"read_timeout", "timeout"}, "", "", K::kNoEffect},
        {"store_type", {"use_libuv", "protocol", "cacert", "cert", "key"}, "", "", K::kForeign},
    };
    return v;
  }();
  return *keys;
}

absl::Status SetRdzvKey(const RdzvKey& k, const std::string& value, RdzvConf* conf,
                        const std::function<absl::Status(const std::string&)>& bad) {
  switch (k.kind) {
    case RdzvKey::Kind::kSeconds:
    case RdzvKey::Kind::kNoEffect: {
      auto d = cli::ParseDuration("rdzv-conf", value, /*allow_zero=*/false);
      if (!d.ok()) return bad("seconds > 0");
      if (k.seconds != nullptr) conf->*k.seconds = *d;
      return absl::OkStatus();
    }
    case RdzvKey::Kind::kCount: {
      int n = 0;
      if (!absl::SimpleAtoi(value, &n) || n < 1) return bad("an integer >= 1");
      conf->*k.count = n;
      return absl::OkStatus();
    }
    case RdzvKey::Kind::kHost:
      if (value == "1" || value == "true" || value == "True") {
        conf->is_host = "true";
      } else if (value == "0" || value == "false" || value == "False") {
        conf->is_host = "false";
      } else {
        return bad("true or false");
      }
      return absl::OkStatus();
    case RdzvKey::Kind::kForeign:
      spdlog::info("--rdzv-conf {}={}: torchrun's c10d/etcd setting, no effect with dlrun's "
                   "rendezvous",
                   k.key, value);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<RdzvConf> ParseRdzvConf(const std::string& text) {
  RdzvConf conf;
  auto items = cli::ParseKeyValues("rdzv-conf", text);
  if (!items.ok()) return items.status();
  for (const auto& [key, value] : *items) {
    const RdzvKey* found = nullptr;
    for (const RdzvKey& k : RdzvKeys()) {
      if (k.key == key || std::count(k.aliases.begin(), k.aliases.end(), key) > 0) found = &k;
    }
    if (found == nullptr) {
      std::vector<std::string> known;
      for (const RdzvKey& k : RdzvKeys()) {
        if (k.kind == RdzvKey::Kind::kForeign) continue;
        known.push_back(k.aliases.empty() ? k.key
                                          : absl::StrCat(k.key, " (", absl::StrJoin(k.aliases, ", "), ")"));
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown key '", key,
                                                     "' in --rdzv-conf: expected one of ",
                                                     absl::StrJoin(known, ", ")));
    }
    // The key as the user wrote it names the error (an alias stays an alias).
    const std::string& k = key;
    const std::string& v = value;
    if (absl::Status s = SetRdzvKey(*found, value, &conf, [&](const std::string& expected) {
          return absl::InvalidArgumentError(absl::StrCat("invalid value '", v, "' for ", k,
                                                         " in --rdzv-conf: expected ", expected));
        });
        !s.ok()) {
      return s;
    }
  }
  return conf;
}

void RdzvConf::ApplyTo(rdzv::Config* config) const {
  if (join_timeout) config->join_timeout = *join_timeout;
  if (last_call) config->last_call = *last_call;
  if (heartbeat_interval) config->heartbeat_interval = *heartbeat_interval;
  if (heartbeat_misses) config->heartbeat_misses = *heartbeat_misses;
  if (heartbeat_timeout) {  // as many intervals as fit, at least one
    const auto n = (heartbeat_timeout->count() + config->heartbeat_interval.count() - 1) /
                   config->heartbeat_interval.count();
    config->heartbeat_misses = static_cast<int>(std::max<int64_t>(1, n));
  }
}

}  // namespace dlrun::launcher
