// The process group's plumbing shared by init() (init.cc) and in-process recovery
// (recovery.cc). Internal to the worker library.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <string>

#include "dlrun/worker.h"

namespace dlrun::worker::detail {

// ctx.store (a TCPStore at ctx.env's MASTER_ADDR:MASTER_PORT, hosted by rank 0) and ctx.pg
// (Gloo, and NCCL for CUDA tensors when `backend` is "nccl"). Throws a one-line
// std::runtime_error naming the address when the store cannot be hosted or reached.
void ConnectGroup(Context& ctx, const std::string& backend, std::chrono::milliseconds timeout);

// work->wait(), except that under in-process recovery a wait on a group whose peer the agent
// said is lost ends in PeerLost (dlrun/recovery.h) instead of waiting for Gloo's timeout.
void WaitWork(const c10::intrusive_ptr<c10d::Work>& work);

// Throws PeerLost when the agent said a peer of this group was lost: at the start of a forward
// and in the backward's hooks, so a survivor stops computing a step that will be done again.
void ThrowIfPeerLost();

}  // namespace dlrun::worker::detail
