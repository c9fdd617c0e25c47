#include "launcher/workers/step_record.h"

#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace dlrun::launcher {
namespace {

bool Seconds(absl::string_view v, double* out) {
  return absl::SimpleAtod(v, out) && std::isfinite(*out) && *out >= 0 && *out < 1e7;
}

}  // namespace

std::optional<StepRecord> ParseStepRecord(const std::string& line) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (f.size() == 2 && f[0] == "C" && f[1] == "recovery") {
    StepRecord r;
    r.kind = RecordKind::kDeclared;
    return r;
  }
  if (f.size() >= 3 && f[0] == "C" && f[1] == "refused") {
    // "C refused RULE...": the rank refuses the in-process recovery under way (dlrun_recovery).
    StepRecord r;
    r.kind = RecordKind::kRefused;
    r.what = line.substr(line.find("refused") + 8);
    return r;
  }
  if (f.size() == 3 && f[0] == "Z" && f[1] == "pause") {
    StepRecord r;
    r.kind = RecordKind::kPause;
    r.what = std::string(f[2]);
    return r;
  }
  if (f.size() == 2 && f[0] == "D" && f[1] == "done") {
    StepRecord r;
    r.kind = RecordKind::kDone;
    return r;
  }
  if (f.size() == 2 && f[0] == "Z" && f[1] == "resume") {
    StepRecord r;
    r.kind = RecordKind::kUnpause;
    return r;
  }
  if (!f.empty() && (f[0] == "R" || f[0] == "P")) {
    StepRecord r;
    r.kind = f[0] == "R" ? RecordKind::kResumed : RecordKind::kFromPeer;
    if (f.size() != 3 || !absl::SimpleAtoi(f[1], &r.step) || r.step < 0 ||
        !Seconds(f[2], &r.step_s)) {
      return std::nullopt;
    }
    return r;
  }
  if (f.size() < 4 || f.size() > 8 || f[0] != "S") return std::nullopt;
  StepRecord r;
  if (!absl::SimpleAtoi(f[1], &r.step) || r.step < 0 || !absl::SimpleAtoi(f[2], &r.samples) ||
      r.samples < 0 || !Seconds(f[3], &r.step_s)) {
    return std::nullopt;
  }
  for (size_t i = 4; i < f.size(); ++i) {
    const size_t eq = f[i].find('=');
    if (eq == absl::string_view::npos) return std::nullopt;
    const absl::string_view key = f[i].substr(0, eq), value = f[i].substr(eq + 1);
    double v = 0;
    std::optional<double>* slot = key == "data_s"      ? &r.data_s
                                  : key == "compute_s" ? &r.compute_s
                                  : key == "sync_s"    ? &r.sync_s
                                  : key == "loss"      ? &r.loss
                                                       : nullptr;
    if (slot == nullptr || slot->has_value()) return std::nullopt;  // unknown or repeated
    if (key == "loss" ? !(absl::SimpleAtod(value, &v) && std::isfinite(v)) : !Seconds(value, &v)) {
      return std::nullopt;
    }
    *slot = v;
  }
  return r;
}

void StepRecordReader::Feed(const char* data, size_t n, std::vector<StepRecord>* out) {
  for (size_t i = 0; i < n; ++i) {
    const char c = data[i];
    if (!in_record_) {
      if (c != '\0' && std::strchr(kStepRecordLetters, c) != nullptr) {  // else: a heartbeat
        in_record_ = true;
        overlong_ = false;
        line_.assign(1, c);
      }
      continue;
    }
    if (c == '\n') {
      if (overlong_) {
        ++bad_;
      } else if (auto r = ParseStepRecord(line_)) {
        out->push_back(*r);
      } else {
        ++bad_;
      }
      in_record_ = false;
      line_.clear();
    } else if (line_.size() >= kMaxStepRecord) {
      overlong_ = true;  // drop the rest up to the newline
    } else {
      line_.push_back(c);
    }
  }
}

}  // namespace dlrun::launcher
