#include "launcher/workers/root_cause.h"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <cstdlib>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/signal_name.h"
#include "nlohmann/json.hpp"

namespace dlrun::launcher {

ErrorRecord ReadErrorRecord(const FileSystem& fs, const std::string& path) {
  ErrorRecord r;
  absl::StatusOr<std::string> text = fs.Read(path, size_t{16} << 20);
  if (!text.ok()) return r;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    r.message = "(unreadable error file " + path + ")";
    return r;
  }
  const nlohmann::json* m = &j;
  if (m->contains("message")) m = &(*m)["message"];
  if (m->is_object()) {
    if (m->contains("extraInfo") && (*m)["extraInfo"].is_object()) {
      const nlohmann::json& extra = (*m)["extraInfo"];
      const auto& ts = extra.value("timestamp", nlohmann::json());
      if (ts.is_string()) r.timestamp = std::atof(ts.get<std::string>().c_str());
      if (ts.is_number()) r.timestamp = ts.get<double>();
      const auto& tb = extra.value("py_callstack", nlohmann::json());
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
    root.message = root.exit.signal != 0 ? absl::StrCat("Signal ", root.exit.signal, " (SIG",
                                                        dlrun::SignalAbbrev(root.exit.signal),
                                                        ") received by PID ", root.exit.pid)
                                         : absl::StrCat("exit code ", root.exit.exit_code);
  }
  return root;
}

const char* FailureClassName(FailureClass c) {
  switch (c) {
    case FailureClass::kExit:
      return "exit";
    case FailureClass::kSignal:
      return "signal";
    case FailureClass::kSegfault:
      return "segfault";
    case FailureClass::kCudaOom:
      return "cuda_oom";
    case FailureClass::kHostOom:
      return "host_oom";
    case FailureClass::kCollectiveTimeout:
      return "collective_timeout";
    case FailureClass::kPeerLost:
      return "peer_lost";
    case FailureClass::kHang:
      return "hang";
  }
  return "exit";
}

namespace {

// Whether `text` holds any of `markers`.
bool HasAny(std::string_view text, std::initializer_list<std::string_view> markers) {
  return std::any_of(markers.begin(), markers.end(),
                     [text](std::string_view m) { return text.find(m) != std::string_view::npos; });
}

// The peer a message names: "peer rank 3", "remote rank 3", "from rank 3", "to rank 3".
std::optional<int> PeerRank(std::string_view text) {
  for (std::string_view phrase : {"peer rank", "remote rank", "from rank", "to rank"}) {
    for (size_t at = text.find(phrase); at != std::string_view::npos;
         at = text.find(phrase, at + 1)) {
      size_t d = at + phrase.size();
      while (d < text.size() && (text[d] == ' ' || text[d] == '=' || text[d] == ':')) ++d;
      int n = 0;
      size_t digits = 0;
      for (; d < text.size() && text[d] >= '0' && text[d] <= '9' && digits < 7; ++d, ++digits) {
        n = n * 10 + (text[d] - '0');
      }
      if (digits > 0) return n;
    }
  }
  return std::nullopt;
}

}  // namespace

Classification ClassifyFailure(const WorkerExit& e, std::string_view text, bool oom_killed) {
  Classification c;
  if (HasAny(text, {"CUDA out of memory", "CUDA error: out of memory", "OutOfMemoryError"})) {
    c.cls = FailureClass::kCudaOom;
    return c;
  }
  if (oom_killed && e.signal == SIGKILL) {
    c.cls = FailureClass::kHostOom;
    return c;
  }
  // NCCL's watchdog ("Watchdog caught collective operation timeout: WorkNCCL(...)"), Gloo's
  // transport ("Timed out waiting 1800000ms for recv operation to complete").
  if (HasAny(text, {"collective operation timeout", "Timed out waiting"})) {
    c.cls = FailureClass::kCollectiveTimeout;
    c.peer_rank = PeerRank(text);
    return c;
  }
  // Gloo ("Connection closed by peer [addr]:port", "Connection reset by peer"), NCCL ("NCCL
  // communicator was aborted", "remote process exited or there was a network error").
  if (HasAny(text, {"Connection reset by peer", "Connection closed by peer",
                    "communicator was aborted", "remote process exited"})) {
    c.cls = FailureClass::kPeerLost;
    c.peer_rank = PeerRank(text);
    return c;
  }
  if (e.signal == SIGSEGV || e.signal == SIGBUS) {
    c.cls = FailureClass::kSegfault;
  } else if (e.signal != 0) {
    c.cls = FailureClass::kSignal;
  }
  return c;
}

std::string HardwareFault(const Classification& c, std::string_view text) {
  if (c.cls == FailureClass::kCudaOom) return "";  // the program's batch, not the node
  if (c.cls == FailureClass::kHostOom) return "the host's OOM killer";
  if (HasAny(text, {"uncorrectable ECC error", "ECCUncorrectable", "Xid", "GPU is lost",
                    "fallen off the bus", "GPU_IS_LOST", "uncorrectable NVLink error"})) {
    return "a GPU fault (ECC, XID, NVLink or a lost GPU)";
  }
  // CUDA errors that a program's own bug does not cause (a device-side assert or an illegal
  // address is the program's: not counted).
  if (HasAny(text, {"CUDA error: unspecified launch failure", "CUDA error: hardware stack error",
                    "busy or unavailable", "CUDA error: system not yet initialized",
                    "CUDA error: the launch timed out"})) {
    return "a CUDA error the device caused";
  }
  if (c.cls == FailureClass::kSegfault &&
      HasAny(text, {"libcuda", "libnvidia", "libnccl", "libcudnn", "libcublas"})) {
    return "a segfault in a CUDA library";
  }
  return "";
}

bool RepeatsTheLast(const FailureSignature& last, const FailureSignature& now) {
  if (last.cls != now.cls || last.rank != now.rank) return false;
  const bool near = (last.step < 0 && now.step < 0) ||
                    (last.step >= 0 && now.step >= 0 && std::abs(last.step - now.step) <= 1);
  if (!near) return false;
  switch (now.cls) {
    case FailureClass::kCudaOom:
    case FailureClass::kHostOom:
    case FailureClass::kSegfault:
    case FailureClass::kHang:
      return true;
    case FailureClass::kExit:
      return now.step >= 0 && last.message == now.message;
    default:
      return false;
  }
}

std::string LastLine(std::string_view text) {
  const size_t end = text.find_last_not_of("\r\n ");
  if (end == std::string_view::npos) return "";
  const size_t newline = text.find_last_of("\r\n", end);
  const size_t begin = newline == std::string_view::npos ? 0 : newline + 1;
  return std::string(text.substr(begin, end + 1 - begin));
}

std::string FailureAdvice(FailureClass c) {
  switch (c) {
    case FailureClass::kCudaOom:
      return "the GPU ran out of memory: try a smaller batch per GPU (with --accumulation-steps "
             "to keep the global batch), activation checkpointing, or mixed precision (AMP)";
    case FailureClass::kHostOom:
      return "the kernel's OOM killer ended it: fewer workers per node, fewer data-loader "
             "workers, or more memory for the job (Slurm: --mem)";
    case FailureClass::kCollectiveTimeout:
      return "a collective timed out: one rank was late or stuck (`dlrun stacks` shows where), "
             "or the network between nodes is down";
    case FailureClass::kHang:
      return "the stacks before the stop are in the run directory (attempt_K/stacks.txt); while "
             "a job hangs, `dlrun stacks` shows where every rank is, and a program declares a "
             "long pause (evaluation, checkpoint) with dlrun_report.pause() or "
             "dlrun::worker::HangPause";
    default:
      return "";
  }
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
    traceback = absl::StrCat("Signal ", e.signal, " (SIG", dlrun::SignalAbbrev(e.signal),
                             ") received by PID ", e.pid);
  } else {
    traceback = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
  }
  absl::StrAppend(out, "[", index, "]:\n", "  time      : ",
                  TimeOf(has_file && rec.timestamp > 0 ? rec.timestamp : e.when_s),
                  "\n  host      : ", r.hostname, "\n  rank      : ", e.global_rank,
                  " (local_rank: ", e.local_rank, ")",
                  "\n  exitcode  : ", e.signal != 0 ? -e.signal : e.exit_code, " (pid: ", e.pid,
                  ")", "\n  error_file: ", has_file ? r.error_file_of(e.local_rank) : "<N/A>",
                  "\n  traceback : ", traceback, "\n");
  if (r.class_of) {
    const Classification c = r.class_of(e);
    absl::StrAppend(out, "  class     : ", FailureClassName(c.cls),
                    c.peer_rank ? absl::StrCat(" (peer rank ", *c.peer_rank, ")") : "", "\n");
  }
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
