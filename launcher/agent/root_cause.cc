#include "launcher/agent/root_cause.h"

#include <string.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dlrun::launcher {

ErrorRecord ReadErrorRecord(const std::string& path) {
  ErrorRecord r;
  std::ifstream in(path);
  if (!in) return r;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    r.message = "(unreadable error file " + path + ")";
    return r;
  }
  const nlohmann::json* m = &j;
  if (m->contains("message")) m = &(*m)["message"];
  if (m->is_object()) {
    if (m->contains("extraInfo") && (*m)["extraInfo"].is_object()) {
      const auto& ts = (*m)["extraInfo"].value("timestamp", nlohmann::json());
      if (ts.is_string()) r.timestamp = std::atof(ts.get<std::string>().c_str());
      if (ts.is_number()) r.timestamp = ts.get<double>();
    }
    if (m->contains("message")) m = &(*m)["message"];
  }
  r.message = m->is_string() ? m->get<std::string>() : m->dump();
  return r;
}

std::string DescribeExit(const WorkerExit& e) {
  if (e.signal != 0) return absl::StrCat("signal ", e.signal, " (SIG", sigabbrev_np(e.signal), ")");
  return absl::StrCat("exit code ", e.exit_code);
}

RootCause PickRootCause(const std::vector<WorkerExit>& exits,
                        const std::function<ErrorRecord(int local_rank)>& error_of) {
  RootCause root;
  double root_ts = 0;
  bool root_has_record = false;
  for (const WorkerExit& e : exits) {  // in the order they exited
    if (!e.failed() || e.stopped) continue;
    const ErrorRecord rec = error_of(e.local_rank);
    const bool has_record = !rec.message.empty();
    const bool earlier = has_record && (!root_has_record || rec.timestamp < root_ts);
    if (!root.found || earlier) {
      root.found = true;
      root.exit = e;
      root.message = rec.message;
      root_ts = rec.timestamp;
      root_has_record = has_record;
    }
  }
  if (root.found && root.message.empty()) {
    root.message = root.exit.signal != 0
                       ? absl::StrCat("Signal ", root.exit.signal, " (SIG",
                                      sigabbrev_np(root.exit.signal), ") received by PID ",
                                      root.exit.pid)
                       : absl::StrCat("exit code ", root.exit.exit_code);
  }
  return root;
}

}  // namespace dlrun::launcher
