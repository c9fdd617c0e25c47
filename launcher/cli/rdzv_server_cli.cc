#include "launcher/cli/rdzv_server_cli.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "common/defaults.h"
#include "launcher/cli/flags.h"
#include "launcher/rdzv/rdzv_config.h"

namespace dlrun::launcher {
namespace {

struct Raw {
  std::string host = "127.0.0.1";
  int port = defaults::kRdzvPort;
  cli::NodeRange nnodes;
  std::string run_id = "none";
  rdzv::Config config;
  cli::TelemetryFlags telemetry;
  bool help = false;
};

std::vector<cli::Flag<Raw>> Flags() {
  using cli::DurationField;
  using cli::IntField;
  using cli::StrField;
  auto config_int = [](const std::string& flag, int rdzv::Config::*field, int lo) {
    return [=](Raw& r, const std::string& v) {
      auto n = cli::ParseInt(flag, v, lo, std::numeric_limits<int>::max());
      if (!n.ok()) return n.status();
      r.config.*field = *n;
      return absl::OkStatus();
    };
  };
  auto config_secs = [](const std::string& flag, rdzv::Duration rdzv::Config::*field) {
    return [=](Raw& r, const std::string& v) {
      auto d = cli::ParseDuration(flag, v, /*allow_zero=*/false);
      if (!d.ok()) return d.status();
      r.config.*field = *d;
      return absl::OkStatus();
    };
  };
  const rdzv::Config defaults;
  std::vector<cli::Flag<Raw>> f = {
      {"host", "", true, StrField(&Raw::host), "address to listen on (default 127.0.0.1)"},
      {"port", "", true, IntField("port", &Raw::port, 0, 65535), absl::StrCat("port (default ", defaults::kRdzvPort, "; 0: any)")},
      {"nnodes", "", true, cli::NodeRangeField("nnodes", &Raw::nnodes), "N or MIN:MAX nodes"},
      {"run-id", "", true, StrField(&Raw::run_id), "the job's run id (--rdzv-id of the agents)"},
      {"max-restarts", "", true, config_int("max-restarts", &rdzv::Config::max_restarts, 0),
       "worker-group restarts before the job fails (default 0)"},
      {"last-call", "", true, config_secs("last-call", &rdzv::Config::last_call),
       "seconds a round with MIN nodes stays open for more"},
      {"join-timeout", "", true, config_secs("join-timeout", &rdzv::Config::join_timeout),
       "seconds for MIN nodes to join"},
      {"heartbeat-interval", "", true,
       config_secs("heartbeat-interval", &rdzv::Config::heartbeat_interval),
       absl::StrCat("seconds between heartbeats (default ",
                    defaults.heartbeat_interval.count() / 1000.0, ")")},
      {"heartbeat-misses", "", true,
       config_int("heartbeat-misses", &rdzv::Config::heartbeat_misses, 1),
       absl::StrCat("missed heartbeats before a node is dead (default ",
                    defaults.heartbeat_misses, ")")},
      {"help", "h", false, cli::BoolField(&Raw::help), "this text"},
  };
  cli::AddTelemetryFlags(&Raw::telemetry, &f);
  return f;
}

}  // namespace

absl::StatusOr<RdzvServerArgs> ParseRdzvServerArgs(const std::vector<std::string>& args,
                                                   const EnvLookup& env) {
  Raw raw;
  auto parsed = cli::ParseFlags(cli::ParseSpec{"dlrun rdzv-server", /*wants_program=*/false},
                                Flags(), args, raw);
  if (!parsed.ok()) return parsed.status();
  RdzvServerArgs out;
  out.help = raw.help;
  if (raw.help) return out;
  out.host.config = raw.config;
  out.host.config.min_nodes = raw.nnodes.min;
  out.host.config.max_nodes = raw.nnodes.max;
  out.host.run_id = raw.run_id;
  auto token = JobToken(env, raw.run_id);
  if (!token.ok()) return token.status();
  out.host.token = *token;
  const bool v6 = raw.host.find(':') != std::string::npos;
  out.host.listen_address = absl::StrCat(v6 ? "[" + raw.host + "]" : raw.host, ":", raw.port);
  out.host.metrics_port = raw.telemetry.metrics_port;
  out.host.metrics_addr = raw.telemetry.metrics_addr;
  out.host.telemetry.straggler_factor = raw.telemetry.straggler_factor;
  out.host.telemetry.straggler_windows = raw.telemetry.straggler_windows;
  return out;
}

std::string RdzvServerUsage() {
  return cli::Usage(absl::StrCat("usage: dlrun rdzv-server [options]\n"
                                 "Runs the rendezvous on its own until the job ends. The job "
                                 "token is read from\n",
                                 contract::kRdzvToken,
                                 " (never from the command line).\n\noptions:\n"),
                    Flags());
}

}  // namespace dlrun::launcher
