#include "launcher/detect/findings.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "common/defaults.h"

namespace dlrun::launcher {

std::optional<std::string> EnvReader::Get(const std::string& name) {
  auto v = env_(name);
  if (v) f_->evidence.emplace_back(name, *v);
  return v;
}

absl::StatusOr<int> EnvReader::Int(const std::string& name, int lo) {
  auto v = Get(name);
  int x = 0;
  if (!v || !absl::SimpleAtoi(*v, &x) || x < lo) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='",
                                                   v.value_or(""),
                                                   "' is invalid: expected an integer >= ", lo));
  }
  return x;
}

absl::StatusOr<std::optional<int>> EnvReader::Port(const std::string& name) {
  auto v = Get(name);
  if (!v) return std::optional<int>();
  int p = 0;
  if (!absl::SimpleAtoi(*v, &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", *v, "' is invalid: expected 1-65535"));
  }
  return std::optional<int>(p);
}

absl::StatusOr<int> EnvReader::RdzvPort() {
  auto p = Port(contract::kRdzvPort);
  if (!p.ok()) return p.status();
  return p->value_or(defaults::kRdzvPort);
}

}  // namespace dlrun::launcher
