#include "launcher/base/preflight.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/defaults.h"

namespace dlrun::launcher {
namespace {

using Clock = std::chrono::steady_clock;

PreflightCheck ComputeCheck(double gflops, std::chrono::milliseconds budget) {
  return {"compute", gflops > 0,
          absl::StrFormat("%.2f GFLOP/s on one core (a %dx%d float product for %.1f s)", gflops,
                          defaults::kPreflightGemmSize, defaults::kPreflightGemmSize,
                          budget.count() / 1000.0)};
}

std::string GiB(double bytes) { return absl::StrFormat("%.1f GiB", bytes / (1ULL << 30)); }

PreflightCheck DiskCheck(std::string dir) {
  struct statvfs st {};
  while (statvfs(dir.c_str(), &st) != 0) {  // the nearest ancestor that exists
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos || dir == "/") {
      return {"disk", true, absl::StrCat("cannot read the free space of ", dir, ": not checked")};
    }
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  const double free = static_cast<double>(st.f_bavail) * st.f_frsize;
  const bool ok = free >= static_cast<double>(defaults::kPreflightMinFreeBytes);
  return {"disk", ok,
          absl::StrCat(GiB(free), " free in ", dir,
                       ok ? "" : absl::StrCat(" (under the ",
                                              GiB(defaults::kPreflightMinFreeBytes),
                                              " a checkpoint needs at least)"))};
}

void GpuChecks(const PreflightAsk& ask, const Nvml* nvml, std::vector<PreflightCheck>* out) {
  auto gpus = nvml != nullptr ? nvml->Query(64, false) : std::nullopt;
  const int seen = gpus ? static_cast<int>(gpus->size()) : 0;
  if (ask.gpus_needed > 0 && seen < ask.gpus_needed) {
    out->push_back({"gpus", false,
                    absl::StrCat(nvml == nullptr ? "NVML cannot be loaded, so no GPU is seen"
                                                 : absl::StrCat("NVML sees ", seen, " GPU(s)"),
                                 "; the job needs ", ask.gpus_needed)});
    return;
  }
  if (!gpus) return;
  out->push_back({"gpus", true, absl::StrCat("NVML sees ", seen, " GPU(s)")});
  for (const NvmlGpu& g : *gpus) {
    const auto h = nvml->Health(g.index);
    if (!h) continue;
    std::vector<std::string> bad;
    if (h->ecc_uncorrected.value_or(0) > 0) {
      bad.push_back(absl::StrCat(*h->ecc_uncorrected, " uncorrected ECC errors since the driver "
                                                      "loaded"));
    }
    if (h->retired_pages_pending.value_or(false)) bad.push_back("retired pages pending a reset");
    if (h->row_remap_pending.value_or(false)) bad.push_back("a row remap pending a reset");
    if (h->row_remap_failed.value_or(false)) bad.push_back("a row remap failed");
    if (!bad.empty()) {
      out->push_back({absl::StrCat("gpu ", g.index), false, absl::StrJoin(bad, ", ")});
    }
  }
}

}  // namespace

absl::StatusOr<PreflightMode> ParsePreflightMode(const std::string& text) {
  if (text == "off") return PreflightMode::kOff;
  if (text == "quick") return PreflightMode::kQuick;
  if (text == "full") return PreflightMode::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("--preflight '", text, "': expected off, quick or full"));
}

const char* PreflightModeName(PreflightMode mode) {
  switch (mode) {
    case PreflightMode::kOff: return "off";
    case PreflightMode::kQuick: return "quick";
    case PreflightMode::kFull: return "full";
  }
  return "off";
}

std::string PreflightReport::Failures() const {
  std::vector<std::string> failed;
  for (const PreflightCheck& c : checks) {
    if (!c.ok) failed.push_back(absl::StrCat(c.name, ": ", c.detail));
  }
  return absl::StrJoin(failed, "; ");
}

double GemmProbe(std::chrono::milliseconds budget) {
  constexpr int n = defaults::kPreflightGemmSize;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f;
    b[i] = static_cast<float>(i % 5) * 0.5f;
  }
  const auto start = Clock::now();
  long products = 0;
  volatile float sink = 0;
  do {
    std::fill(c.begin(), c.end(), 0.0f);
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < n; ++k) {
        const float aik = a[i * n + k];
        for (int j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
      }
    }
    sink = sink + c[products % (n * n)];
    ++products;
  } while (Clock::now() - start < budget);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return 2.0 * n * n * n * static_cast<double>(products) / seconds / 1e9;
}

PreflightReport RunPreflight(const PreflightAsk& ask, const Nvml* nvml) {
  PreflightReport r;
  if (ask.mode == PreflightMode::kOff) return r;
  GpuChecks(ask, nvml, &r.checks);
  if (!ask.checkpoint_dir.empty()) r.checks.push_back(DiskCheck(ask.checkpoint_dir));
  const auto budget =
      ask.mode == PreflightMode::kFull ? defaults::kPreflightFull : defaults::kPreflightQuick;
  r.gflops = GemmProbe(budget);
  r.checks.push_back(ComputeCheck(r.gflops, budget));
  return r;
}

std::string CheckpointDirOf(const std::vector<std::string>& program_args,
                            const std::string& fallback) {
  static constexpr const char* kFlags[] = {"--checkpoint-dir", "--checkpoint_dir", "--save-dir",
                                           "--save_dir",       "--output-dir",     "--output_dir"};
  for (size_t i = 0; i < program_args.size(); ++i) {
    const std::string& a = program_args[i];
    for (const char* flag : kFlags) {
      const std::string f(flag);
      if (a == f && i + 1 < program_args.size()) return program_args[i + 1];
      if (a.rfind(f + "=", 0) == 0) return a.substr(f.size() + 1);
    }
  }
  return fallback;
}

}  // namespace dlrun::launcher
