// dlrun::worker: process-group setup for LibTorch trainers (gradient synchronisation is
// DistributedDataParallel in dlrun/ddp.h).
//
//   auto ctx = dlrun::worker::init();          // reads RANK, WORLD_SIZE, MASTER_ADDR, ...
//   dlrun::worker::DistributedDataParallel ddp(model.ptr(), ctx.pg);
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <chrono>
#include <optional>
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
  // Keep freed memory in the process for the next step (keepFreedMemory() below).
  bool keep_freed_memory = true;
};

struct Context {
  DistEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  // A warm spare: when the agent promoted it (awaitPromotion() returned); unset otherwise.
  std::optional<std::chrono::steady_clock::time_point> promoted_at;
  int rank() const { return env.rank; }
  int worldSize() const { return env.world_size; }
};

// Creates the c10d TCPStore (hosted by rank 0) and the process group. Throws std::runtime_error
// with a one-line message (naming the variable, or the master address and port) on failure.
Context init(const InitOptions& options = {});

// A Gloo process group over `store` for a trainer that makes its own store (or a one-rank group
// over a c10d::HashStore in a test), bound to `address` ("" = the host's default interface).
// init() makes its Gloo backend the same way; Gloo's headers stay inside the library.
c10::intrusive_ptr<c10d::ProcessGroup> makeGlooGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& address,
    std::chrono::milliseconds timeout = std::chrono::minutes(5));

// "auto" -> "nccl" where LibTorch has CUDA and a GPU is visible, else "gloo". Throws a one-line
// std::runtime_error for an unknown name, or "nccl" without CUDA or without a GPU, before any
// process group is made (init() calls it first).
std::string ResolveBackend(const std::string& requested);

// A 64-bit digest of the exact bytes of `tensors` (for checking ranks agree bit for bit).
uint64_t digest(const std::vector<torch::Tensor>& tensors);

}  // namespace dlrun::worker
