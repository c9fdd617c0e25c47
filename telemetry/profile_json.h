// One rank's profile as JSON and as report text: the end-of-job report and `--report-json`
// (telemetry_report.cc) and `dlrun profile`'s answer and output (launcher/profile/live_profile.cc)
// say it the same way (docs/PROFILING.md).
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"
#include "telemetry/telemetry.h"

namespace dlrun::telemetry {

// {rank, host, tool, path, hot: [{frame, fraction}], note}: an entry of "profile_details".
nlohmann::json ProfileDetailJson(const RankProfile& p);
// `indent` "profile of rank R (TOOL on HOST): PATH (NOTE)", then, when there are hot frames, a
// line `indent` "  rank R: 41% in f; ..." with the first three.
std::string ProfileText(const RankProfile& p, absl::string_view indent);

}  // namespace dlrun::telemetry
