// What a step changed, seen and put back (step_state.h).
#include "step_state.h"

#include <torch/torch.h>

#include <mutex>

#include "dlrun/worker.h"

namespace dlrun::worker::detail {

int64_t Versions(const torch::nn::Module& model) {
  int64_t v = 0;
  for (const torch::Tensor& p : model.parameters()) v += static_cast<int64_t>(p._version());
  return v;
}

void CopyInto(const std::vector<torch::Tensor>& to, const std::vector<torch::Tensor>& from) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < to.size() && i < from.size(); ++i) to[i].copy_(from[i]);
}

bool UpdateRaisesVersions(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::RMSprop*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::Adagrad*>(&optimizer) != nullptr;
}

bool SameTensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

uint64_t CpuRngDigest() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return digest({gen.get_state()});
}

uint64_t StepSeed(uint64_t seed, int64_t step, int rank) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(step) * 1000003ULL +
                                               static_cast<uint64_t>(rank) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace dlrun::worker::detail
