#include "rendezvous/tls.h"

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/contract.h"

namespace dlrun::rdzv {
namespace {

// The contents of `file` (named by environment variable `var`), which must hold PEM text with
// the block `marker` ("CERTIFICATE" or "PRIVATE KEY").
absl::StatusOr<std::string> ReadPem(const char* var, const std::string& file,
                                    const char* marker) {
  std::ifstream in(file, std::ios::binary);
  std::string text;
  try {
    if (in) text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {
    in.setstate(std::ios::badbit);
  }
  if (!in.is_open() || in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", var, "='", file, "': expected a readable PEM file"));
  }
  if (!absl::StrContains(text, "-----BEGIN ") ||
      !absl::StrContains(text, absl::StrCat(marker, "-----"))) {
    return absl::InvalidArgumentError(absl::StrCat(var, "='", file, "' holds no PEM ", marker,
                                                   ": expected a file with a -----BEGIN ",
                                                   marker, "----- block"));
  }
  return text;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

absl::StatusOr<TlsConfig> LoadTlsConfig(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file,
                                        const std::string& server_name) {
  TlsConfig c;
  if (ca_file.empty() && cert_file.empty() && key_file.empty()) {
    if (!server_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          contract::kRdzvTlsServerName, "='", server_name, "' is set without TLS: expected ",
          contract::kRdzvTlsCa, ", _CERT and _KEY as well"));
    }
    return c;
  }
  if (ca_file.empty() || cert_file.empty() || key_file.empty()) {
    std::string missing;
    for (auto [name, value] : {std::pair{contract::kRdzvTlsCa, &ca_file},
                               std::pair{contract::kRdzvTlsCert, &cert_file},
                               std::pair{contract::kRdzvTlsKey, &key_file}}) {
      if (value->empty()) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous TLS is half configured (", missing,
        " unset): expected ", contract::kRdzvTlsCa, ", _CERT and _KEY all set (mutual TLS) or none"));
  }
  auto ca = ReadPem(contract::kRdzvTlsCa, ca_file, "CERTIFICATE");
  if (!ca.ok()) return ca.status();
  auto cert = ReadPem(contract::kRdzvTlsCert, cert_file, "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(contract::kRdzvTlsKey, key_file, "PRIVATE KEY");
  if (!key.ok()) return key.status();
  c.ca_pem = std::move(*ca);
  c.cert_pem = std::move(*cert);
  c.key_pem = std::move(*key);
  c.server_name = server_name;
  return c;
}

absl::StatusOr<TlsConfig> TlsConfigFromEnv() {
  return LoadTlsConfig(Env(contract::kRdzvTlsCa), Env(contract::kRdzvTlsCert),
                       Env(contract::kRdzvTlsKey), Env(contract::kRdzvTlsServerName));
}

}  // namespace dlrun::rdzv
