// The U-Net trainer's GPU path: device choice, cuDNN/TF32 settings, channels-last, and mixed
// precision (autocast + dynamic loss scaling). With a CUDA LibTorch (DLRUN_WITH_CUDA) the CUDA
// parts (stream copies) are compiled in every build; a CPU-only LibTorch compiles the rest, and
// the choice is made at run time. No GPU on the development and CI machines: GradScaler and
// channels-last are tested on the CPU, scripts/gpu-check runs the rest on a GPU.
#pragma once

#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/torch.h>

#include <memory>

#include <string>
#include <vector>

namespace dlrun::examples {

// "auto" (CUDA when LibTorch has it and a GPU is visible, else CPU), "cpu" or "cuda". The GPU
// is LOCAL_RANK's among the visible ones (dlrun narrows CUDA_VISIBLE_DEVICES to one).
torch::Device PickDevice(const std::string& want, int local_rank);

// On CUDA: cudnn.benchmark and TF32 for matmul and convolutions (as the tutorial's
// torch.backends settings; `tf32` false: full FP32, as NVIDIA_TF32_OVERRIDE=0 forces for the
// whole process). A no-op on the CPU.
void ConfigureBackends(const torch::Device& device, bool tf32 = true, bool deterministic = false);

// The most memory the caching allocator had allocated on a CUDA device (max_memory_allocated);
// -1 on the CPU.
int64_t PeakDeviceMemoryBytes(const torch::Device& device);

// Parameters of rank >= 5 (Conv3d / ConvTranspose3d weights) to channels-last-3d, in place:
// the parameter objects stay the same, so optimizers and DDP keep working.
void ToChannelsLast(const std::vector<torch::Tensor>& params);

// `t` on `device`: on CUDA copied from pinned memory on a side stream that the current stream
// waits for (no host sync); elsewhere `t` itself.
torch::Tensor ToDeviceAsync(const torch::Tensor& t, const torch::Device& device);

// The most CPU tensor memory allocated at once while the scope lives, counting only what was
// allocated inside it (the CPU analogue of CUDA's max_memory_allocated: activations, workspaces,
// gradients, optimizer state; not RSS, which the allocator's retained memory blurs). Through
// LibTorch's memory reporting hook (c10::MemoryReportingInfoBase) on this thread.
class CpuAllocationPeak {
 public:
  CpuAllocationPeak();
  ~CpuAllocationPeak();
  CpuAllocationPeak(const CpuAllocationPeak&) = delete;
  CpuAllocationPeak& operator=(const CpuAllocationPeak&) = delete;
  int64_t peakBytes() const;

 private:
  struct Reporter;
  std::shared_ptr<Reporter> reporter_;
  std::unique_ptr<c10::DebugInfoGuard> guard_;
};

// Autocast (float16 on CUDA) for the scope's forward pass and loss, when enabled.
class AutocastScope {
 public:
  explicit AutocastScope(bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
  bool previous_ = false;
};

// Dynamic loss scaling, as torch.cuda.amp.GradScaler: backward on scale(loss); unscale() divides
// the (already DDP-averaged) gradients by the scale and says whether they are all finite; skip
// the optimizer step when they are not; update() halves the scale after an overflow and doubles
// it after `growth_interval` finite steps. Every rank sees the same averaged gradients, so
// every rank takes the same decision.
class GradScaler {
 public:
  explicit GradScaler(bool enabled, double init_scale = 65536.0, int64_t growth_interval = 2000);
  torch::Tensor scale(const torch::Tensor& loss) const;
  bool unscale(const std::vector<torch::Tensor>& params);
  void update(bool finite);
  double currentScale() const { return scale_; }
  int64_t goodSteps() const { return good_steps_; }
  // From a checkpoint (train_unet's "amp.scale", "amp.good_steps"): a resume goes on with the
  // scale the run had reached instead of the initial one.
  void restore(double scale, int64_t good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
  }
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  double scale_;
  int64_t growth_interval_;
  int64_t good_steps_ = 0;
};

}  // namespace dlrun::examples
