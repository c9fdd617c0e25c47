// The process group's plumbing shared by init() (init.cc) and in-process recovery
// (recovery.cc). Internal to the worker library.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <optional>
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
// The same for a communication hook's future (its error is its own: value() throws it).
void WaitFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future);

// The step a checkpoint resume (CheckpointManager::resume_latest, either form) left this process
// at: a Recovery goes on from it, whether or not the trainer calls commit(step) after the
// resume. Taken once: -1 when no resume came since the last take.
void NoteResumedStep(int64_t step);
int64_t TakeResumedStep();

// The group reports an error of its own (PyTorch's NCCL watchdog saw a lost peer or a timeout):
// its last sums may have been ended under it. False where LibTorch cannot tell (before 2.8, or
// a backend without Backend::getError, such as Gloo).
bool GroupFailed(c10d::ProcessGroup& pg);

// ncclCommAbort on every communicator of `pg` (ProcessGroup::abort, LibTorch >= 2.7): a kernel
// waiting on a lost peer ends. A failing abort, or a LibTorch without it, is one line on stderr
// (the recovery's timeout ends the rest).
void AbortGroup(c10d::ProcessGroup& pg);

// Whether a step's optimizer update may be applied once its collectives were waited for: always
// where they end before the library's wait returns (Gloo); with NCCL, not when the agent's word
// of a lost peer came or the group failed, for an aborted sum may miss the peer.
bool SettledStepMayApply(bool collectives_run_behind, bool word_heard, bool group_failed);

// Under dlrun's agent link (contract::kControlFd: in-process recovery may keep this process
// through a peer's loss), PyTorch's NCCL teardown is turned off, as dlrun_recovery does for
// Python: its watchdog would end a survivor at the lost peer's error before the group is rebuilt.
// TORCH_NCCL_ASYNC_ERROR_HANDLING (and NCCL_ASYNC_ERROR_HANDLING) become 0 over dlrun's default
// (contract::kNcclErrorHandlingDefault), never over a value the user set; elsewhere nothing
// changes.
void TurnOffNcclTeardownForRecovery();

// Whether the DistributedDataParallel made last over `module` broadcasts its buffers (the
// recovery's refusals and lines say whose running statistics a rank holds); nullopt when none
// was made.
void NoteBufferBroadcast(const torch::nn::Module* module, bool broadcast);
std::optional<bool> BroadcastsBuffers(const torch::nn::Module* module);

// Throws PeerLost when the agent said a peer of this group was lost: at the start of a forward
// and in the backward's hooks, so a survivor stops computing a step that will be done again.
void ThrowIfPeerLost();

}  // namespace dlrun::worker::detail
