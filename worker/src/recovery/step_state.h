// What a step of in-process recovery changed, seen and put back (recovery.cc): the parameters'
// version counters, copies, the CPU generator's digest and the per-step seed. Internal to the
// worker library.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "dlrun/worker.h"

namespace dlrun::worker::detail {

// The sum of the parameters' version counters: any in-place change (an optimizer's update)
// raises it.
int64_t Versions(const torch::nn::Module& model);
// Each of `from` into the tensor of `to` at its place.
void CopyInto(const std::vector<torch::Tensor>& to, const std::vector<torch::Tensor>& from);
// Whether an update by `optimizer` raises its parameters' version counters (Versions()). LibTorch's
// SGD updates through Tensor::data(), whose in-place change leaves the parameter's counter as
// it was, as may an optimizer of the trainer's own: for those a step's change is seen by
// comparing the parameters with a copy (Recovery's StepUndo::params_at).
bool UpdateRaisesVersions(const torch::optim::Optimizer& optimizer);
bool SameTensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b);
// The digest of the CPU generator's state.
uint64_t CpuRngDigest();
// Every rank's CPU generator state, one row per rank (collective over ctx): a generator seeded
// per rank, as of a commit, so that a rank that lost it (a replacement, a resume) takes its own.
torch::Tensor GatherCpuRng(const Context& ctx);
// This process's CPU generator from row `rank` of `table` (GatherCpuRng); false when the table
// has not `world_size` rows (gathered in a group of another size).
bool SetCpuRngFromTable(const torch::Tensor& table, int rank, int world_size);
// RecoveryOptions::seed_per_rank: one seed per (seed, step, rank) (splitmix64's mixing).
uint64_t StepSeed(uint64_t seed, int64_t step, int rank);

}  // namespace dlrun::worker::detail
