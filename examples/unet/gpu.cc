#include "unet/gpu.h"

#include <ATen/autocast_mode.h>
#ifdef DLRUN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <unordered_map>

namespace dlrun::examples {

torch::Device PickDevice(const std::string& want, int local_rank) {
  if (want != "auto" && want != "cpu" && want != "cuda") {
    throw std::runtime_error("invalid value '" + want + "' for --device: expected auto, cpu or cuda");
  }
  const bool cuda = torch::cuda::is_available();
  if (want == "cuda" && !cuda) {
#ifdef DLRUN_WITH_CUDA
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw std::runtime_error(
        "--device cuda: no GPU is usable (none is visible to this process; "
        "CUDA_VISIBLE_DEVICES='" +
        std::string(visible ? visible : "(unset)") + "'): use --device cpu");
#else
    throw std::runtime_error(
        "--device cuda: no GPU is usable (this LibTorch has no CUDA: build dlrun against a CUDA "
        "build of torch)");
#endif
  }
  if (want == "cpu" || !cuda) return torch::Device(torch::kCPU);
  const int n = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(n == 1 ? 0 : local_rank % n));
}

void ConfigureBackends(const torch::Device& device, bool tf32, bool deterministic) {
  if (!device.is_cuda()) return;
  if (deterministic) {  // runs that are compared bit for bit (scripts/gpu-check's recovery)
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);  // before cuBLAS's first use
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  at::globalContext().setBenchmarkCuDNN(!deterministic);
  at::globalContext().setAllowTF32CuBLAS(tf32);
  at::globalContext().setAllowTF32CuDNN(tf32);
}

int64_t PeakDeviceMemoryBytes(const torch::Device& device) {
  if (!device.is_cuda()) return -1;
#ifdef DLRUN_WITH_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
#else
  return -1;
#endif
}

void ToChannelsLast(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.dim() == 5) {
      torch::Tensor q = p;  // shares the TensorImpl: set_data changes the parameter itself
      q.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast3d));
    }
  }
}

AutocastScope::AutocastScope(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  previous_ = at::autocast::is_autocast_enabled(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);  // float16, as torch.autocast("cuda")
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(at::kCUDA, previous_);
  if (!previous_) at::autocast::clear_cache();
}

torch::Tensor ToDeviceAsync(const torch::Tensor& t, const torch::Device& device) {
  if (!device.is_cuda()) return t;
#ifdef DLRUN_WITH_CUDA
  // The copy runs on a side stream from pinned memory, so it overlaps the compute queued on
  // the current stream; the current stream waits for it with an event (not the host), and the
  // tensor is marked as used there so its memory is not reused while the compute reads it.
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, device.index());
  torch::Tensor out;
  {
    const c10::cuda::CUDAStreamGuard on_copy(copy);
    out = t.pin_memory().to(device, /*non_blocking=*/true);
  }
  at::cuda::CUDAEvent copied;
  copied.record(copy);
  copied.block(compute);
  out.record_stream(compute);
  return out;
#else
  return t.to(device);
#endif
}

struct CpuAllocationPeak::Reporter : public c10::MemoryReportingInfoBase {
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    const int64_t now = current.fetch_add(alloc_size) + alloc_size;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  std::atomic<int64_t> current{0}, peak{0};
};

CpuAllocationPeak::CpuAllocationPeak()
    : reporter_(std::make_shared<Reporter>()),
      guard_(std::make_unique<c10::DebugInfoGuard>(c10::DebugInfoKind::PROFILER_STATE, reporter_)) {}

CpuAllocationPeak::~CpuAllocationPeak() = default;

int64_t CpuAllocationPeak::peakBytes() const { return reporter_->peak.load(); }

GradScaler::GradScaler(bool enabled, double init_scale, int64_t growth_interval)
    : enabled_(enabled), scale_(init_scale), growth_interval_(growth_interval) {}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return enabled_ ? loss * scale_ : loss;
}

bool GradScaler::unscale(const std::vector<torch::Tensor>& params) {
  if (!enabled_) return true;
  torch::NoGradGuard no_grad;
  // PyTorch's own kernel (as torch.amp.GradScaler.unscale_): one fused pass per device that
  // multiplies every gradient by 1/scale and sets found_inf when any is inf or NaN, on the
  // gradients' device (CPU or CUDA); one host sync for the verdict.
  std::unordered_map<torch::Device, std::vector<torch::Tensor>> by_device;
  for (const auto& p : params) {
    const torch::Tensor& g = p.grad();
    if (g.defined()) by_device[g.device()].push_back(g);
  }
  bool finite = true;
  for (auto& [device, grads] : by_device) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
    torch::Tensor found_inf = torch::zeros({1}, opts);
    torch::Tensor inv_scale = torch::full({1}, 1.0 / scale_, opts);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    finite = finite && found_inf.item<float>() == 0.0f;
  }
  return finite;
}

void GradScaler::update(bool finite) {
  if (!enabled_) return;
  if (!finite) {
    scale_ *= 0.5;
    good_steps_ = 0;
  } else if (++good_steps_ >= growth_interval_) {
    scale_ *= 2.0;
    good_steps_ = 0;
  }
}

}  // namespace dlrun::examples
