// dlrun::worker: process-group setup for LibTorch trainers (gradient synchronisation is
// DistributedDataParallel in dlrun/ddp.h).
//
//   auto ctx = dlrun::worker::init();          // reads RANK, WORLD_SIZE, MASTER_ADDR, ...
//   dlrun::worker::DistributedDataParallel ddp(model, ctx.pg);
//   auto loss_sum = ctx.all_reduce(torch::tensor({loss_value}));     // small collectives
//   if (!ctx.ranks_agree(dlrun::worker::digest(model->parameters()))) std::abort();
//
// Errors are exceptions with one-line messages (std::runtime_error; std::invalid_argument for
// bad settings), here and in every header of the library.
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
#include "dlrun/nvtx_ranges.h"

namespace dlrun::worker {

struct InitOptions {
  // How long rank 0 waits for the others and the others retry reaching rank 0's store.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // "gloo" (CPU), "nccl" (where LibTorch has CUDA) or "auto".
  std::string backend = "auto";
  // Keep freed memory in the process for the next step (keep_freed_memory() below).
  bool keep_freed_memory = true;
  // A crash's native frames to stderr for dlrun's failure report (install_crash_trace()).
  bool crash_trace = true;
  // Ignore SIGPIPE, as Python does at its start: a write to a peer that died (Gloo's sockets, the
  // store's) then fails with EPIPE, which the recovery handles, instead of killing the survivor.
  // A handler the program installed before init() is kept.
  bool ignore_sigpipe = true;
};

struct Context {
  DistEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  // A warm spare: when the agent promoted it (await_promotion() returned); unset otherwise.
  std::optional<std::chrono::steady_clock::time_point> promoted_at;
  // The backend init() resolved ("gloo" or "nccl"); in-process recovery rebuilds the group with it.
  std::string backend = "gloo";
  int rank() const { return env.rank; }
  int world_size() const { return env.world_size; }

  // Small collectives over `pg`, for a trainer's bookkeeping (losses, counts, flags, checks);
  // every rank must make the same calls in the same order. They block until done. CPU tensors
  // go through Gloo, CUDA tensors through NCCL when init() made it.
  // Sums (or `op`: c10d::ReduceOp::MAX, MIN, PRODUCT, AVG on NCCL) `t` in place and returns it.
  torch::Tensor all_reduce(torch::Tensor t, c10d::ReduceOp op = c10d::ReduceOp::SUM) const;
  // Every rank's `t` (same shape and type everywhere), indexed by rank.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) const;
  // Rank `root`'s `t` into every rank's `t` (in place); returns it.
  torch::Tensor broadcast(torch::Tensor t, int root = 0) const;
  void barrier() const;
  // True on every rank when every rank passed the same value, e.g.
  // ctx.ranks_agree(dlrun::worker::digest(model->parameters())); ranks_differing() names them.
  bool ranks_agree(uint64_t value) const;
  // The ranks whose value differs from rank 0's (empty when all agree).
  std::vector<int> ranks_differing(uint64_t value) const;
};

// Creates the c10d TCPStore (hosted by rank 0) and the process group. Throws std::runtime_error
// with a one-line message (naming the variable, or the master address and port) on failure.
Context init(const InitOptions& options = {});

// A Gloo process group over `store` for a trainer that makes its own store (or a one-rank group
// over a c10d::HashStore in a test), bound to `address` ("" = the host's default interface).
// init() makes its Gloo backend the same way; Gloo's headers stay inside the library.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& address,
    std::chrono::milliseconds timeout = std::chrono::minutes(5));

// "auto" -> "nccl" where LibTorch has CUDA and a GPU is visible, else "gloo". Throws a one-line
// std::runtime_error for an unknown name, or "nccl" without CUDA or without a GPU, before any
// process group is made (init() calls it first).
std::string resolve_backend(const std::string& requested);

// A 64-bit digest of the exact bytes of `tensors` (for checking ranks agree bit for bit).
uint64_t digest(const std::vector<torch::Tensor>& tensors);

}  // namespace dlrun::worker
