// The HTTP side of job telemetry (docs/TELEMETRY.md): /metrics in Prometheus' text format
// (telemetry/exposition.h), /api/job as JSON, and / the live page, served by
// telemetry/http_server.h on threads of its own. Read-only; nothing secret (no token, no
// environment) is on any of them. Lives in the rendezvous plugin.
#include "telemetry/metrics_http.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "telemetry/exposition.h"
#include "telemetry/http_server.h"

namespace dlrun::telemetry {

extern const char* const kTelemetryPage;  // page.html, compiled in (rendezvous/CMakeLists.txt)

std::string PrometheusText(const JobTelemetry::Snapshot& s) {
  Exposition reg;
  auto gauge = [&reg](const char* name, const char* help) -> MetricFamily& {
    return reg.Gauge(name, help);
  };
  auto& step = gauge("dlrun_step_time_seconds", "Median step time of the rank's recent steps");
  auto& compute = gauge("dlrun_compute_seconds",
                        "Mean compute (and data wait) per step before the gradient sync");
  auto& sync = gauge("dlrun_sync_wait_seconds", "Mean wait per step inside the gradient sync");
  auto& sps = gauge("dlrun_samples_per_second", "Samples per second of step time, per rank");
  auto& data = gauge("dlrun_data_wait_fraction", "Fraction of step time spent waiting for data");
  auto& cpu = gauge("dlrun_cpu_utilization", "CPU cores busy over the last sampling period");
  auto& rss = gauge("dlrun_rss_bytes", "Resident memory of the rank's process");
  auto& rss_peak = gauge("dlrun_rss_peak_bytes", "Peak resident memory of the rank's process");
  auto& steps = gauge("dlrun_steps", "Steps the rank reported");
  auto& gpu_util = gauge("dlrun_gpu_utilization", "GPU utilization over NVML's last period (0-1)");
  auto& gpu_mem = gauge("dlrun_gpu_memory_used_bytes", "GPU memory in use");
  auto& straggler = gauge("dlrun_straggler", "1 while the rank is named a straggler");
  auto& loss = gauge("dlrun_loss", "The loss the rank reported last");
  auto& restarts = reg.Counter("dlrun_restarts_total", "Restarts of the worker group");
  restarts.Add({}).Increment(s.restarts);
  gauge("dlrun_nodes", "Nodes in the running round").Add({}).Set(s.nodes);
  gauge("dlrun_world_size", "Ranks in the running round").Add({}).Set(s.world_size);
  gauge("dlrun_lost_seconds", "Time lost to restarts and rendezvous").Add({}).Set(s.lost_s);
  // The restart ledger by phase (docs/TELEMETRY.md, "Time lost to restarts").
  auto& phase = gauge("dlrun_restart_phase_seconds",
                      "Time lost to restarts in each phase, summed over the restarts");
  const RestartCost sum = SumOfRestartCosts(s.restart_costs);
  for (const auto& [name, v] : sum.Phases()) phase.Add({{"phase", name}}).Set(v);
  gauge("dlrun_recomputed_steps", "Steps computed again after restarts")
      .Add({})
      .Set(static_cast<double>(sum.recomputed_steps));
  gauge("dlrun_goodput_ratio", "Share of the wall time spent in steps that were kept (0-1)")
      .Add({})
      .Set(s.wall_s > 0 ? std::min(1.0, s.productive_s / s.wall_s) : 0.0);
  gauge("dlrun_samples_per_second_total", "Samples per second over all ranks")
      .Add({})
      .Set(s.samples_per_sec);
  for (const auto& [rank, r] : s.ranks) {
    const std::string rk = std::to_string(rank);
    step.Add({{"rank", rk}, {"host", r.host}}).Set(r.step_p50_s);
    steps.Add({{"rank", rk}}).Set(static_cast<double>(r.steps));
    if (r.has_split && r.steps > 0) {
      compute.Add({{"rank", rk}}).Set((r.compute_s + r.data_s) / static_cast<double>(r.steps));
      sync.Add({{"rank", rk}}).Set(r.sync_s / static_cast<double>(r.steps));
    }
    if (r.step_s > 0) sps.Add({{"rank", rk}}).Set(static_cast<double>(r.samples) / r.step_s);
    if (r.has_data && r.step_s > 0) data.Add({{"rank", rk}}).Set(r.data_s / r.step_s);
    if (r.cpu_utilization) cpu.Add({{"rank", rk}}).Set(*r.cpu_utilization);
    if (r.rss_bytes > 0) rss.Add({{"rank", rk}}).Set(static_cast<double>(r.rss_bytes));
    if (r.rss_peak_bytes > 0) rss_peak.Add({{"rank", rk}}).Set(static_cast<double>(r.rss_peak_bytes));
    if (r.loss) loss.Add({{"rank", rk}}).Set(*r.loss);
    bool named = false;
    for (const Straggler& st : s.stragglers) named |= st.rank == rank && st.active;
    straggler.Add({{"rank", rk}}).Set(named ? 1 : 0);
  }
  for (const GpuTelemetry& g : s.gpus) {
    const Labels l{{"gpu", std::to_string(g.index)}, {"host", g.host}};
    gpu_util.Add(l).Set(g.utilization);
    gpu_mem.Add(l).Set(static_cast<double>(g.memory_used_bytes));
  }
  return reg.Text();
}

namespace {

class HttpMetrics final : public MetricsServer {
 public:
  explicit HttpMetrics(std::shared_ptr<JobTelemetry> t) : t_(std::move(t)) {
    srv_.Get("/metrics", [this](const std::string&, HttpResponse* res) {
      res->set_content(PrometheusText(t_->TakeSnapshot(std::chrono::steady_clock::now())),
                       "text/plain; version=0.0.4; charset=utf-8");
    });
    srv_.Get("/api/job", [this](const std::string&, HttpResponse* res) {
      res->set_header("Cache-Control", "no-store");
      res->set_content(SnapshotJson(t_->TakeSnapshot(std::chrono::steady_clock::now()), true),
                       "application/json");
    });
    // A profile's file (docs/PROFILING.md), when it lies on this host: the page links each.
    srv_.GetPrefix("/profile/", [this](const std::string& rest, HttpResponse* res) {
      int rank = -1;
      if (rest.empty() || rest.size() > 7 || !absl::SimpleAtoi(rest, &rank) || rank < 0) {
        res->status = 404;
        res->set_content(absl::StrCat("no profile '", rest.substr(0, 40), "': expected /profile/<rank>\n"),
                         "text/plain");
        return;
      }
      ServeProfile(rank, res);
    });
    srv_.Get("/", [](const std::string&, HttpResponse* res) {
      res->set_content(kTelemetryPage, "text/html; charset=utf-8");
    });
  }
  ~HttpMetrics() override { srv_.Stop(); }

  absl::Status Start(const std::string& addr, int port) {
    absl::StatusOr<int> bound = srv_.Listen(addr, port);
    if (!bound.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", addr, ":", port, ": ",
                                                 bound.status().message()));
    }
    port_ = *bound;
    return absl::OkStatus();
  }
  int port() const override { return port_; }

 private:
  // Only the paths the agents reported (the snapshot's), and only regular files of at most
  // 256 MB: anything else is a 404 that says where the file is.
  void ServeProfile(int rank, HttpResponse* res) {
    const JobTelemetry::Snapshot s = t_->TakeSnapshot(std::chrono::steady_clock::now());
    auto it = s.profiles.find(rank);
    if (it == s.profiles.end() || it->second.path.empty()) {
      res->status = 404;
      res->set_content(absl::StrCat("rank ", rank, " has no profile\n"), "text/plain");
      return;
    }
    const RankProfile& p = it->second;
    std::error_code ec;
    const auto size = std::filesystem::file_size(p.path, ec);
    if (ec || !std::filesystem::is_regular_file(p.path, ec) || size > (256u << 20)) {
      res->status = 404;
      res->set_content(absl::StrCat("rank ", rank, "'s profile is ", p.path, " on ", p.host,
                                    ", not readable from this host\n"),
                       "text/plain");
      return;
    }
    std::ifstream in(p.path, std::ios::binary);
    std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const char* type = absl::EndsWith(p.path, ".svg")    ? "image/svg+xml"
                       : absl::EndsWith(p.path, ".json") ? "application/json"
                                                          : "application/octet-stream";
    if (std::string(type) == "application/octet-stream") {
      res->set_header("Content-Disposition", absl::StrCat("attachment; filename=\"",
                                                          std::filesystem::path(p.path).filename().string(), "\""));
    }
    res->set_content(std::move(body), type);
  }

  std::shared_ptr<JobTelemetry> t_;
  HttpServer srv_;
  int port_ = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    std::shared_ptr<JobTelemetry> telemetry, const std::string& addr, int port) {
  auto m = std::make_unique<HttpMetrics>(std::move(telemetry));
  if (absl::Status s = m->Start(addr, port); !s.ok()) return s;
  return std::unique_ptr<MetricsServer>(std::move(m));
}

}  // namespace dlrun::telemetry
