#include "telemetry/exposition.h"

#include <cmath>
#include <cstdio>

namespace dlrun::telemetry {
namespace {

// Label values escape backslash, double quote and newline; help text backslash and newline.
void AppendEscaped(std::string* out, const std::string& s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (quote && c == '"') {
      *out += "\\\"";
    } else {
      *out += c;
    }
  }
}

}  // namespace

std::string ExpositionValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.16g", v);
  return buf;
}

MetricSample& MetricFamily::Add(const Labels& labels) {
  for (auto& [l, s] : samples_) {
    if (l == labels) return s;
  }
  return samples_.emplace_back(labels, MetricSample{}).second;
}

void MetricFamily::AppendText(std::string* out) const {
  if (samples_.empty()) return;
  *out += "# HELP " + name_ + " ";
  AppendEscaped(out, help_, false);
  *out += "\n# TYPE " + name_ + " " + type_ + "\n";
  for (const auto& [labels, sample] : samples_) {
    *out += name_;
    if (!labels.empty()) {
      *out += '{';
      bool first = true;
      for (const auto& [k, v] : labels) {
        if (!first) *out += ',';
        first = false;
        *out += k + "=\"";
        AppendEscaped(out, v, true);
        *out += '"';
      }
      *out += '}';
    }
    *out += ' ' + ExpositionValue(sample.value()) + '\n';
  }
}

std::string Exposition::Text() const {
  std::string out;
  for (const MetricFamily& f : families_) f.AppendText(&out);
  return out;
}

}  // namespace dlrun::telemetry
