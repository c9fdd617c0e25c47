#include "launcher/agent/root_cause.h"

#include <string.h>
#include <time.h>

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
    if (m->contains("extraInfo") && (*m)["extraInfo"].is_object()) {
      const auto& tb = (*m)["extraInfo"].value("py_callstack", nlohmann::json());
      if (tb.is_string()) r.traceback = tb.get<std::string>();
    }
    if (m->contains("message")) m = &(*m)["message"];
  }
  r.message = m->is_string() ? m->get<std::string>() : m->dump();
  return r;
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

namespace {

std::string TimeOf(double epoch_s) {
  const time_t t = static_cast<time_t>(epoch_s);
  struct tm tm;
  localtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

void AppendFailure(const FailureReport& r, const WorkerExit& e, int index, std::string* out) {
  const ErrorRecord rec = r.error_of(e.local_rank);
  const bool has_file = !rec.message.empty();
  std::string traceback;
  if (has_file) {
    traceback = rec.traceback.empty() ? rec.message : rec.traceback;
  } else if (e.signal != 0) {
    traceback = absl::StrCat("Signal ", e.signal, " (SIG", sigabbrev_np(e.signal),
                             ") received by PID ", e.pid);
  } else {
    traceback = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
  }
  absl::StrAppend(out, "[", index, "]:\n",
                  "  time      : ", TimeOf(has_file && rec.timestamp > 0 ? rec.timestamp : e.when_s),
                  "\n  host      : ", r.hostname,
                  "\n  rank      : ", e.global_rank, " (local_rank: ", e.local_rank, ")",
                  "\n  exitcode  : ", e.signal != 0 ? -e.signal : e.exit_code, " (pid: ", e.pid, ")",
                  "\n  error_file: ", has_file ? r.error_file_of(e.local_rank) : "<N/A>",
                  "\n  traceback : ", traceback, "\n");
}

}  // namespace

std::string FormatFailureReport(const FailureReport& r) {
  const std::string rule(60, '=');
  const std::string thin(60, '-');
  std::string out = absl::StrCat(rule, "\n", r.program, " FAILED\n", thin, "\nFailures:\n");
  int index = 1;
  for (const WorkerExit& e : r.exits) {
    if (!e.failed() || e.stopped || e.pid == r.root.exit.pid) continue;
    AppendFailure(r, e, index++, &out);
  }
  if (index == 1) absl::StrAppend(&out, "  <NO_OTHER_FAILURES>\n");
  absl::StrAppend(&out, thin, "\nRoot Cause (first observed failure):\n");
  AppendFailure(r, r.root.exit, 0, &out);
  absl::StrAppend(&out, rule, "\n");
  return out;
}

}  // namespace dlrun::launcher
