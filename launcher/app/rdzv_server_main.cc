// `dlrun rdzv-server`: a stand-alone rendezvous server (the plugin's Serve, in the foreground).
#include <cstdio>

#include "launcher/app/commands.h"
#include "launcher/cli/options.h"
#include "launcher/cli/rdzv_server_cli.h"
#include "launcher/rdzv/rdzv_loader.h"
#include "rendezvous/tls.h"

namespace dlrun::launcher {

int RdzvServerMain(const std::vector<std::string>& args) {
  auto parsed = ParseRdzvServerArgs(args, ProcessEnv());
  if (!parsed.ok()) return Fail(parsed.status());
  if (parsed->help) return Print(RdzvServerUsage());
  if (parsed->version) return Print(cli::VersionText());
  auto tls = rdzv::TlsConfigFromEnv();
  if (!tls.ok()) return Fail(tls.status());
  parsed->host.tls = std::move(*tls);
  auto api = LoadRendezvous();
  if (!api.ok()) return Fail(api.status());
  return (*api)->Serve(parsed->host);
}

}  // namespace dlrun::launcher
