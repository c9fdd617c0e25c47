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

torch::Tensor GatherCpuRng(const Context& ctx) {
  torch::Tensor mine;
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    mine = gen.get_state();
  }
  return torch::stack(ctx.all_gather(mine));
}

bool SetCpuRngFromTable(const torch::Tensor& table, int rank, int world_size) {
  if (!table.defined() || table.dim() != 2 || table.size(0) != world_size || rank >= world_size ||
      table.scalar_type() != torch::kUInt8) {
    return false;
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const torch::Tensor row = table[rank].to(torch::kCPU).clone();
  if (row.numel() != gen.get_state().numel()) return false;
  gen.set_state(row);
  return true;
}

}  // namespace dlrun::worker::detail
