// Prometheus' text exposition format (version 0.0.4), written directly: a family is its name,
// help, type and samples; labels are sorted and escaped as the format says. Used for /metrics
// (telemetry/metrics_http.cc). No dependency, so the rendezvous plugin links statically into
// a portable wheel (docs/PACKAGING.md).
#pragma once

#include <deque>
#include <map>
#include <string>

namespace dlrun::telemetry {

using Labels = std::map<std::string, std::string>;

class MetricSample {
 public:
  void Set(double v) { value_ = v; }
  void Increment(double by) { value_ += by; }
  double value() const { return value_; }

 private:
  double value_ = 0;
};

class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, const char* type)
      : name_(std::move(name)), help_(std::move(help)), type_(type) {}
  // The sample with these labels (made at 0 the first time).
  MetricSample& Add(const Labels& labels);
  void AppendText(std::string* out) const;

 private:
  std::string name_, help_;
  const char* type_;
  std::deque<std::pair<Labels, MetricSample>> samples_;
};

class Exposition {
 public:
  MetricFamily& Gauge(const std::string& name, const std::string& help) {
    return families_.emplace_back(name, help, "gauge");
  }
  MetricFamily& Counter(const std::string& name, const std::string& help) {
    return families_.emplace_back(name, help, "counter");
  }
  // Every family with at least one sample, in the order they were made.
  std::string Text() const;

 private:
  std::deque<MetricFamily> families_;
};

// A sample value as Prometheus reads it: 16 significant digits, NaN and +Inf/-Inf spelled.
std::string ExpositionValue(double v);

}  // namespace dlrun::telemetry
