#include "launcher/cli/rdzv_server_cli.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "common/defaults.h"
#include "common/host_port.h"
#include "launcher/cli/flags.h"
#include "launcher/cli/rdzv_conf.h"
#include "launcher/cli/job_token.h"

namespace dlrun::launcher {
namespace {

struct Raw : cli::CommandLine {
  std::string host = "127.0.0.1";
  int port = defaults::kRdzvPort;
  cli::NodeRange nnodes;
  std::string run_id = "none";
  rdzv::Config config;
  RdzvConf conf;  // --last-call, --join-timeout, --heartbeat-*: the --rdzv-conf keys' flags
  cli::TelemetryFlags telemetry;
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
  std::vector<cli::Flag<Raw>> f = {
      {"host", "", true, StrField(&Raw::host), "address to listen on (default 127.0.0.1)"},
      {"port", "", true, IntField("port", &Raw::port, 0, 65535), absl::StrCat("port (default ", defaults::kRdzvPort, "; 0: any)")},
      {"nnodes", "", true, cli::NodeRangeField("nnodes", &Raw::nnodes), "N or MIN:MAX nodes"},
      {"run-id", "", true, StrField(&Raw::run_id), "the job's run id (--rdzv-id of the agents)"},
      {"max-restarts", "", true, config_int("max-restarts", &rdzv::Config::max_restarts, 0),
       "worker-group restarts before the job fails (default 0)"},
  };
  AddRdzvConfFlags(&Raw::conf, &f);
  cli::AddTelemetryFlags(&Raw::telemetry, &f);
  return f;
}

}  // namespace

absl::StatusOr<RdzvServerArgs> ParseRdzvServerArgs(const std::vector<std::string>& args,
                                                   const EnvLookup& env) {
  Raw raw;
  auto parsed = cli::ParseCommand(cli::ParseSpec{"dlrun rdzv-server", /*wants_program=*/false},
                                 Flags(), args, raw);
  if (!parsed.ok()) return parsed.status();
  RdzvServerArgs out;
  out.help = raw.help;
  out.version = raw.version;
  if (out.help || out.version) return out;
  out.host.config = raw.config;
  raw.conf.ApplyTo(&out.host.config);
  out.host.config.min_nodes = raw.nnodes.min;
  out.host.config.max_nodes = raw.nnodes.max;
  out.host.run_id = raw.run_id;
  auto token = JobToken(env, raw.run_id);
  if (!token.ok()) return token.status();
  out.host.token = *token;
  out.host.listen_address = JoinHostPort(raw.host, raw.port);
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
