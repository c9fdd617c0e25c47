// In-process recovery (docs/RECOVERY.md, "A fault costs one step"): when a rank dies, the dlrun
// agent keeps the surviving processes, starts a replacement for the lost rank, and tells the
// survivors the group's next generation. The survivors give up the broken collectives, build
// the new process group, and the replacement takes the model, the optimizer and the training
// state from a survivor (one broadcast); every rank checks that it holds the same parameters,
// and the interrupted step is done again. No checkpoint is read.
//
//   dlrun::worker::Recovery recovery(ctx, *model, optimizer);
//   int64_t start = 0;
//   if (recovery.replacement()) {
//     start = recovery.receive().step;  // before the DDP wrapper, as the survivors
//   } else if (auto st = ckpt.resumeLatest(*model, optimizer, ctx)) {
//     start = st->step;
//   }
//   auto ddp = std::make_unique<dlrun::worker::DistributedDataParallel<Net>>(model, ctx.pg);
//   for (int64_t step = start + 1; step <= steps; ++step) {
//     const auto r = recovery.run([&] {
//       train_step(*ddp, step);  // its collectives all come before optimizer.step()
//       recovery.commit(step);   // right after optimizer.step()
//     });
//     if (r.recovered) {  // ctx.pg is the new group; every rank holds the state of r.step
//       ddp = std::make_unique<dlrun::worker::DistributedDataParallel<Net>>(model, ctx.pg);
//       step = r.step;  // the loop goes on with r.step + 1: the interrupted step again
//     }
//   }
//
// The program declares it can recover to the agent when the Recovery is made; outside dlrun, or
// under `dlrun --recovery restart`, run() only runs the body and its exceptions stand. A
// recovery that cannot finish (no word from the agent, the new group not complete within
// RecoveryOptions::timeout, ranks that differ after the transfer) throws a one-line
// std::runtime_error: the process exits and the agent falls back to the ordinary restart from
// the checkpoint.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>

#include "dlrun/checkpoint.h"
#include "dlrun/worker.h"

namespace dlrun::worker {

namespace detail {
struct Regroup;  // the agent's word (internal)
}  // namespace detail

// Thrown by the library's collectives (Context's, DistributedDataParallel's) when the agent said
// a peer of the group was lost while they waited.
class PeerLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A point where a long computation may give up the step at once when the agent said a peer
// was lost: throws PeerLost then (Recovery::run catches it), costs one atomic load otherwise.
// The library's collectives and DistributedDataParallel's forward and gradient hooks are such
// points already; a trainer adds it between the layers of a forward that runs for long on the
// CPU (train_unet: between the U-Net's levels), so a survivor stops within a layer.
void interruptionPoint();

struct RecoveryOptions {
  // A step that threw without the agent's word: how long to wait for it before the exception
  // stands (the agent writes it within milliseconds of a worker's death).
  std::chrono::milliseconds word_timeout{3000};
  // The new group and the state transfer, at most.
  std::chrono::milliseconds timeout{60000};
};

struct RecoveryHooks {
  // The trainer's state beyond the model and the optimizer (AMP scale, extra tensors, values),
  // as of the last committed step; `step`, `world_size` are filled in by the library.
  std::function<TrainingState()> capture;
  // Applied on the ranks that took the state from a peer (the replacement, and a survivor that
  // was a step behind).
  std::function<void(const TrainingState&)> restore;
};

class Recovery {
 public:
  // Declares in-process recovery to the dlrun agent (when there is one). `ctx` is updated in
  // place at a recovery (its store and pg are the new generation's).
  Recovery(Context& ctx, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
           RecoveryHooks hooks = {}, RecoveryOptions options = {});

  // Under a dlrun agent that offers in-process recovery.
  bool enabled() const { return enabled_; }
  // This process replaces a lost rank (DLRUN_RECOVERY_GEN): call receive() first, before the
  // DistributedDataParallel wrapper, as a survivor's recovery does the same collectives.
  bool replacement() const { return replacement_; }
  // The replacement's side of the state transfer: loads the survivor's model, optimizer and
  // CPU RNG in place, calls hooks.restore, returns the state (its step: the last completed).
  TrainingState receive();

  // The step whose optimizer update is done (call it right after optimizer.step()): a recovery
  // goes on from the highest step a survivor committed.
  void commit(int64_t step) { committed_ = step; }
  int64_t committed() const { return committed_; }

  struct Outcome {
    bool recovered = false;
    int64_t step = 0;        // recovered: the step the ranks hold now (go on with step + 1)
    int generation = 0;      // recovered: the group's generation
    double seconds = 0;      // recovered: from the exception to the state agreed
    // A node was lost and the job goes on without it: this rank's place changed (ctx.rank(),
    // ctx.worldSize() are the new ones). Rank-dependent streams (data shards, seeds) follow.
    bool resized = false;
  };
  // Runs `body`; a peer lost during it is a recovery (Outcome::recovered) instead of an
  // exception. Other exceptions, and any exception when recovery is not enabled, propagate.
  Outcome run(const std::function<void()>& body);

 private:
  TrainingState Transfer(int64_t my_step, bool* loaded, int* root);
  // Joins the group the agent's word names (a new place in it when a node was lost).
  void Regroup(const detail::Regroup& word);

  Context& ctx_;
  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  RecoveryHooks hooks_;
  RecoveryOptions options_;
  struct Timing {
    double serialize_s = 0, send_s = 0, load_s = 0, check_s = 0;
  } timing_;
  bool enabled_ = false;
  bool replacement_ = false;
  int64_t committed_ = 0;
};

}  // namespace dlrun::worker
