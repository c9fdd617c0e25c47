// Optional TLS for the rendezvous, configured like the token: by environment
// variables naming PEM files, never by command-line arguments.
//   contract::kRdzvTlsCa    the CA that signed the job's certificates
//   contract::kRdzvTlsCert  this node's certificate (chain)
//   contract::kRdzvTlsKey   its private key
//   contract::kRdzvTlsServerName (optional) the name to verify in the server's certificate
//                        instead of the endpoint's host (one job certificate for every node)
// All three files or none: TLS here is always mutual. The server (the hosting agent or
// `dlrun rdzv-server`) presents the certificate and requires a client certificate signed by the
// CA; clients verify the server against the CA and present the same kind of certificate. The
// token is still checked on every call. No gRPC types here: the launcher reads the files
// before it loads the rendezvous library.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dlrun::rdzv {

struct TlsConfig {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string server_name;  // empty: the endpoint's host
  bool enabled() const { return !cert_pem.empty(); }
};

// Reads the files named by the TLS variables of common/contract.h; a config with enabled() false when
// none is set. Errors name the variable, the file and what was expected.
absl::StatusOr<TlsConfig> TlsConfigFromEnv();

// The same from explicit paths (empty: unset).
absl::StatusOr<TlsConfig> LoadTlsConfig(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file,
                                        const std::string& server_name);

}  // namespace dlrun::rdzv
