// In-process recovery's state transfer (recovery.cc): one survivor sends the model, the
// optimizer and the training state to the ranks that lost it, point to point over the new
// group. The tensors go as they are, each straight into the receiver's tensor (no
// serialization) for the optimizers whose state it knows (Adam, AdamW, SGD); any other
// optimizer goes whole as checkpoint bytes. Internal to the worker library.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "dlrun/checkpoint.h"
#include "dlrun/recovery.h"
#include "dlrun/worker.h"

namespace dlrun::worker::detail {

struct TransferTiming {
  double serialize_s = 0, send_s = 0, load_s = 0;
};

// On the sending rank: `state` (the training state of the step it holds) to every rank in `to`.
void SendState(const Context& ctx, const torch::nn::Module& model,
               const torch::optim::Optimizer& optimizer, const TrainingState& state,
               const std::vector<int>& to, TransferTiming* timing);

// On a receiving rank: the model and optimizer in place, the CPU RNG, and the training state
// returned. Throws a one-line std::runtime_error when what arrives does not fit this model.
TrainingState ReceiveState(const Context& ctx, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, int root, TransferTiming* timing);

// The first parameter of `model` whose digest differs on rank `other` from rank 0's
// (collective: one allgather); "" when none.
std::string FirstDifferingParameter(const Context& ctx, const torch::nn::Module& model, int other);

// A copy of an optimizer's state (its learning rates are not in it), for a step's undo
// (recovery.cc).
struct OptimizerCopy {
  bool known = false;  // an optimizer whose state is known here (Adam, AdamW, SGD)
  std::vector<int64_t> layout;
  std::vector<torch::Tensor> tensors;
};
// A copy of the optimizer's state into `copy`: into its tensors where they match (no allocation
// a step), else new ones.
void CopyOptimizerInto(const torch::optim::Optimizer& optimizer, OptimizerCopy* copy);
// `to` becomes a copy of `from` (detached): copied into its tensors where each has the same
// shape, type and device, else made anew (clone()).
void CloneInto(std::vector<torch::Tensor>* to, const std::vector<torch::Tensor>& from);
void RestoreOptimizer(torch::optim::Optimizer& optimizer, const OptimizerCopy& copy);

// The trainer's other optimizers (RecoveryHooks::optimizers) as part of its state: each one's
// state tensors (or, for a kind not known here, its archive's bytes) and learning rates under
// "dlrun.optimizer.N." (N = 1, 2, ...), into `state`.
void CaptureOptimizers(const std::vector<torch::optim::Optimizer*>& optimizers, TrainingState* state);
// Puts them back from `state`; a one-line std::runtime_error when it holds none for optimizer N
// (a checkpoint written without it) or a state that does not fit it.
void RestoreOptimizers(const std::vector<torch::optim::Optimizer*>& optimizers,
                       const TrainingState& state);
// `hooks` whose capture and restore also carry hooks.optimizers (CaptureOptimizers).
RecoveryHooks WithOptimizers(RecoveryHooks hooks);
// The name of the first parameter of `model` that needs a gradient and is in none of
// `optimizers`' groups ("" when each is in one).
std::string FirstParameterOutside(const torch::nn::Module& model,
                                  const std::vector<const torch::optim::Optimizer*>& optimizers);

}  // namespace dlrun::worker::detail
