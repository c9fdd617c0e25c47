#include "unet/gpu.h"

#include <ATen/autocast_mode.h>

#include <stdexcept>

namespace dlrun::examples {

torch::Device PickDevice(const std::string& want, int local_rank) {
  if (want != "auto" && want != "cpu" && want != "cuda") {
    throw std::runtime_error("invalid value '" + want + "' for --device: expected auto, cpu or cuda");
  }
  const bool cuda = torch::cuda::is_available();
  if (want == "cuda" && !cuda) {
    throw std::runtime_error(
        "--device cuda: no GPU is usable (this LibTorch has no CUDA, or none is visible)");
  }
  if (want == "cpu" || !cuda) return torch::Device(torch::kCPU);
  const int n = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(n == 1 ? 0 : local_rank % n));
}

void ConfigureBackends(const torch::Device& device) {
  if (!device.is_cuda()) return;
  at::globalContext().setBenchmarkCuDNN(true);
  at::globalContext().setAllowTF32CuBLAS(true);
  at::globalContext().setAllowTF32CuDNN(true);
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
  previous_ = at::autocast::is_enabled();
  at::autocast::set_enabled(true);
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  at::autocast::set_enabled(previous_);
  if (!previous_) at::autocast::clear_cache();
}

GradScaler::GradScaler(bool enabled, double init_scale, int64_t growth_interval)
    : enabled_(enabled), scale_(init_scale), growth_interval_(growth_interval) {}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return enabled_ ? loss * scale_ : loss;
}

bool GradScaler::unscale(const std::vector<torch::Tensor>& params) {
  if (!enabled_) return true;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> bad;
  for (const auto& p : params) {
    torch::Tensor g = p.grad();
    if (!g.defined()) continue;
    bad.push_back(torch::logical_not(torch::isfinite(g)).any());
    g.mul_(1.0 / scale_);
  }
  return bad.empty() || !torch::stack(bad).any().item<bool>();
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
