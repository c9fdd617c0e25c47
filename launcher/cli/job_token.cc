#include "launcher/cli/job_token.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/contract.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
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
