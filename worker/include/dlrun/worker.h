// dlrun::worker: process-group setup and gradient synchronisation for LibTorch trainers.
//
//   auto ctx = dlrun::worker::init();          // reads RANK, WORLD_SIZE, MASTER_ADDR, ...
//   dlrun::worker::broadcastParameters(*ctx.pg, model->parameters());
//   ... loss.backward(); dlrun::worker::averageGradients(*ctx.pg, model->parameters()); ...
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "dlrun/agent_link.h"
#include "dlrun/dist_env.h"

namespace dlrun::worker {

struct InitOptions {
  // How long rank 0 waits for the others and the others retry reaching rank 0's store.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // "gloo" (CPU), "nccl" (where LibTorch has CUDA) or "auto".
  std::string backend = "auto";
};

struct Context {
  DistEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  int rank() const { return env.rank; }
  int worldSize() const { return env.world_size; }
};

// Creates the c10d TCPStore (hosted by rank 0) and the process group. Throws std::runtime_error
// with a one-line message (naming the variable, or the master address and port) on failure.
Context init(const InitOptions& options = {});

// Copies rank 0's values of `tensors` to every rank (in place).
void broadcastParameters(c10d::ProcessGroup& pg, const std::vector<torch::Tensor>& tensors);

// Averages the gradients of `params` over all ranks in one flat allreduce.
void averageGradients(c10d::ProcessGroup& pg, const std::vector<torch::Tensor>& params);

// A 64-bit digest of the exact bytes of `tensors` (for checking ranks agree bit for bit).
uint64_t digest(const std::vector<torch::Tensor>& tensors);

}  // namespace dlrun::worker
