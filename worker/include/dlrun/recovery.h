// In-process recovery (docs/RECOVERY.md, "A fault costs one step"): when a rank dies, the dlrun
// agent keeps the surviving processes, starts a replacement for the lost rank, and tells the
// survivors the group's next generation. The survivors give up the broken collectives, build
// the new process group, and the replacement takes the model, the optimizer and the training
// state from a survivor (one broadcast); every rank checks that it holds the same parameters,
// and the interrupted step is done again. No checkpoint is read. dlrun::worker::Recoverable
// (dlrun/recoverable.h) is the whole loop in one object, the DDP wrapper with it (custom_trainer
// and train_unet use it); these are its parts, for a trainer that builds its own loop.
//
//   dlrun::worker::Recovery recovery(ctx, *model, optimizer);
//   int64_t start = 0;
//   if (recovery.replacement()) {
//     start = recovery.receive().step;  // before the DDP wrapper, as the survivors
//   } else if (auto st = ckpt.resume_latest(*model, optimizer, ctx)) {
//     start = st->step;
//   }
//   auto ddp = std::make_unique<dlrun::worker::DistributedDataParallel<Net>>(model, ctx.pg);
//   for (int64_t step = start + 1; step <= steps; ++step) {
//     const auto r = recovery.run([&] {
//       train_step(*ddp, step);  // forward, backward
//       recovery.update();       // in place of optimizer.step()
//       recovery.commit(step);   // the step's end
//     });
//     if (r.recovered) {  // ctx.pg is the new group; every rank holds the state of r.step
//       dlrun::worker::rebuild_after_recovery(ddp, ctx.pg);  // ddp.h: the wrapper anew
//       step = r.step;  // the loop goes on with r.step + 1: the interrupted step again
//     }
//   }
//
// NCCL (ctx.backend "nccl"): the agent's word aborts the group's communicators at once (a kernel
// waiting on the lost peer ends), and the step's collectives, which run behind the CPU, are
// waited for before the optimizer's update: update() does it, or await_collectives() right before
// an optimizer.step() of the trainer's own. A step whose sums may miss the lost peer is given up,
// never applied; an update applied without that wait when a peer was lost refuses the recovery.
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
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <stdexcept>

#include "dlrun/checkpoint.h"
#include "dlrun/worker.h"

namespace dlrun::worker {

namespace detail {
struct Regroup;  // the agent's word (internal)
struct TransferPlan;  // the state transfer's plan (internal)
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
void interruption_point();

struct RecoveryOptions {
  // A step that threw without the agent's word: how long to wait for it before the exception
  // stands (the agent writes it within milliseconds of a worker's death).
  std::chrono::milliseconds word_timeout{3000};
  // The new group and the state transfer, at most.
  std::chrono::milliseconds timeout{60000};
  // Randomness of each rank's own (Dropout that differs per rank, noise): set, run() seeds the
  // CPU generator at each step's start from (this seed, the step, the rank), so a replacement
  // and a resume draw what the lost rank would have, at no cost. Unset, a CPU generator the
  // trainer seeded per rank (torch::manual_seed(s + rank)) is gathered from every rank at each
  // step's update and commit (an allgather of ~5 KB a rank), so the lost rank's own is known
  // and goes to its replacement (and into Recoverable's checkpoints); a fault before the first
  // gather that needs it (the first step of new processes) refuses the recovery in one line.
  std::optional<uint64_t> seed_per_rank;
};

struct RecoveryHooks {
  // The trainer's state beyond the model and the optimizer (AMP scale, extra tensors, values),
  // as of the last committed step; `step`, `world_size` are filled in by the library.
  std::function<TrainingState()> capture;
  // Applied on the ranks that took the state from a peer (the replacement, and a survivor that
  // was a step behind).
  std::function<void(const TrainingState&)> restore;
  // The trainer's other optimizers (a second model's, a GAN's discriminator's), beside the one
  // the Recovery is made with: their state and learning rates are part of the trainer's state
  // (captured, sent, undone with it; in Recoverable's checkpoints). A parameter that needs a
  // gradient and is in none of the optimizers refuses a recovery that sends the state.
  std::vector<torch::optim::Optimizer*> optimizers;
};

struct UpdateOptions {
  // The update itself when it is more than optimizer.step() of the Recovery's optimizer: a loss
  // scaler's unscale, skip and scale (the trainer's state, given through RecoveryHooks).
  std::function<void()> apply;
  // Nothing after the update in the step runs a collective or changes the state (what only
  // reads it, a checkpoint's save, printing, aside): the step is committed at the update, and
  // nothing is copied before it (train_unet: 88 MB a step). A peer lost after it keeps the step.
  bool ends_step = false;
};

class Recovery {
 public:
  // Declares in-process recovery to the dlrun agent (when there is one). `ctx` is updated in
  // place at a recovery (its store and pg are the new generation's).
  Recovery(Context& ctx, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
           RecoveryHooks hooks = {}, RecoveryOptions options = {});
  ~Recovery();
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // Under a dlrun agent that offers in-process recovery.
  bool enabled() const { return enabled_; }
  // This process replaces a lost rank (DLRUN_RECOVERY_GEN): call receive() first, before the
  // DistributedDataParallel wrapper, as a survivor's recovery does the same collectives.
  bool replacement() const { return replacement_; }
  // The replacement's side of the state transfer: loads the survivor's model, optimizer and
  // CPU RNG in place, calls hooks.restore, returns the state (its step: the last completed).
  TrainingState receive();

  // The step is complete on this rank: a recovery goes on from the highest step a survivor
  // committed. Right after optimizer.step(), or at the end of the step's work when the update
  // went through update(). Work after commit() in the same body is not done again at a
  // recovery: keep it to what only reads the state (validation, logging); buffers it changed
  // are put back, parameters it changed refuse the recovery.
  void commit(int64_t step);
  int64_t committed() const { return committed_; }
  // The trainer's state as the hooks give it (hooks.capture, the other optimizers'), and back.
  TrainingState capture_state() const;
  void restore_state(const TrainingState& state);

  // The optimizer's update inside run()'s body, in place of optimizer.step(): the step's
  // collectives are waited for (await_collectives()), the parameters and the optimizer's state
  // copied (one more copy of them in memory), so that a peer lost later in the same step (a
  // collective after the update, an EMA's, a logging all-reduce) gives the whole step up; then
  // commit() at the step's end (docs/RECOVERY.md, "A step is whole or not at all").
  // UpdateOptions: an update of the trainer's own, and an update that ends the step.
  void update(const UpdateOptions& options = {});
  // Optimizer updates applied by update() as of the last committed step: compared across the
  // ranks at a recovery (a rank that updated another number of times refuses it).
  int64_t updates() const { return updates_committed_; }

  // Right before the optimizer's update, inside run()'s body, when the update is the trainer's
  // own optimizer.step() (update() calls it): with NCCL, waits for the step's collectives on the
  // GPU and gives the step up (PeerLost) when the agent's word of a lost peer came meanwhile or
  // the group reports an error, for their sums may miss the peer. Otherwise (Gloo: every wait
  // of the library's already ends in PeerLost) it does nothing.
  void await_collectives();

  struct Outcome {
    bool recovered = false;
    int64_t step = 0;        // recovered: the step the ranks hold now (go on with step + 1)
    int generation = 0;      // recovered: the group's generation
    double seconds = 0;      // recovered: from the exception to the state agreed
    // A node was lost and the job goes on without it: this rank's place changed (ctx.rank(),
    // ctx.world_size() are the new ones). Rank-dependent streams (data shards, seeds) follow.
    bool resized = false;
  };
  // Runs `body` (one step); a peer lost during it is a recovery (Outcome::recovered) instead of
  // an exception. Other exceptions, and any exception when recovery is not enabled, propagate.
  // A step given up is undone on this rank first: the module's buffers (BatchNorm's running
  // statistics), the learning rates, the CPU RNG and the trainer's state (hooks.capture() at
  // the body's start, given back through hooks.restore) as at the body's start, the parameters
  // and the optimizer's state as before update(). What cannot be undone (the parameters changed
  // without update() or after commit()) refuses the recovery in one line: the checkpoint. A
  // change is seen by the parameters' version counters, or, for an optimizer whose update
  // leaves them as they were (LibTorch's SGD, an optimizer of the trainer's own; Adam, AdamW,
  // RMSprop and Adagrad raise them), by a copy of the parameters taken at the step's start and
  // at commit() (one more copy of them in memory).
  Outcome run(const std::function<void()>& body);

 private:
  struct StepUndo;     // the open step's undo record (recovery.cc)
  struct AbortTarget;  // the group the agent's word aborts (NCCL; recovery.cc)
  // Who sends the state and who takes it (one allgather; detail::DecideTransfer).
  detail::TransferPlan PlanTransfer(int64_t my_step);
  TrainingState Transfer(int64_t my_step, bool* loaded, int* root);
  void BeginStep();  // the undo record of the step about to run
  // Puts back what the given-up step changed (StepUndo); throws the refusal when it cannot.
  void GiveUp();
  // The parameters changed since the open step's start (or its commit()).
  bool ParametersChanged() const;
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
  int64_t running_ = 0;  // the step run() runs: committed_ + 1 at its start
  int64_t updates_ = 0, updates_committed_ = 0;  // update() calls: all, as of commit()
  // The CPU generator differed across ranks when the Recovery was made (seeded per rank), and
  // its digest then: a step that drew from it refuses a transfer to a rank behind.
  bool rng_per_rank_ = false;
  uint64_t rng_at_start_ = 0;
  // Seeded per rank: every rank's generator as of the last commit and update (an allgather at
  // each), so a replacement and a resume take the lost rank's own (a draw after the update and
  // before a checkpoint in the same step is not in the checkpoint's); undefined until the first.
  torch::Tensor rng_table_;
  torch::Tensor rng_table_in_step_;  // gathered at the open step's update
  std::shared_ptr<StepUndo> undo_;
  std::shared_ptr<AbortTarget> abort_;  // set with NCCL
};

}  // namespace dlrun::worker
