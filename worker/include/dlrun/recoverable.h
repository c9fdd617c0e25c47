// dlrun::worker::Recoverable: in-process recovery with the shape of Python's
// dlrun_recovery.Recoverable. One object, made from the model, the optimizer and the trainer's
// own state, resumes (from a peer when this process replaces a lost rank, else from the
// checkpoint, collectively), owns the DistributedDataParallel wrapper (built after the resume,
// rebuilt over the new group after a recovery with its options, bucket order and comm hook) and
// runs the loop: a step is whole or not at all, and a lost rank costs that one step.
//
//   dlrun::worker::CheckpointManager ckpt({.dir = "ckpt"});
//   dlrun::worker::Recoverable rec(ctx, model, optimizer, {.checkpoint = &ckpt});
//   rec.run(total_steps, [&](int64_t step) {  // from the step after the one resumed
//     optimizer.zero_grad();
//     torch::mse_loss(rec.ddp()(x_of(step)), y_of(step)).backward();
//     rec.update();  // optimizer.step(), undone if a peer is lost later in the step
//     // anything after it (an EMA, a logging all-reduce, a checkpoint) is part of the step
//   });
//
// The rules (docs/EMBEDDING.md, "A lost rank costs one step"): the step's data is a function of
// `step` (a sampler's position set from it, or indices), the update goes through update(), the
// trainer's state beyond the model and the optimizer (an EMA, a loss scale) is given as
// `state` (capture/restore), and randomness of each rank's own comes from
// RecoveryOptions::seed_per_rank. What cannot be made exact is refused in one line, and the
// agent restarts the group from the checkpoint. Outside dlrun, or under `dlrun --recovery
// restart`, run() runs the steps one after another and exceptions stand.
#pragma once

#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dlrun/checkpoint.h"
#include "dlrun/ddp.h"
#include "dlrun/recovery.h"
#include "dlrun/sync_batch_norm.h"
#include "dlrun/worker.h"

namespace dlrun::worker {

struct RecoverableOptions {
  DDPOptions ddp;
  // The trainer's state beyond the model and the optimizer, as of the last whole step: sent to
  // a replacement, put back in a step given up, and restored from the checkpoint's resume.
  RecoveryHooks state;
  RecoveryOptions recovery;
  // Resumed from, collectively, when the process starts (not in a replacement); the trainer
  // saves into it (checkpoint_state(step) gives the state to save). Null: no resume.
  CheckpointManager* checkpoint = nullptr;
  // A communication hook, made for each group: the first, and each one after a recovery.
  std::function<std::unique_ptr<c10d::CommHookInterface>(c10::intrusive_ptr<c10d::ProcessGroup>)>
      comm_hook;
  // The resume's options, and where its warnings go (a rank that resumed from another rank's
  // file, a damaged checkpoint skipped); unset: stderr.
  ResumeOptions resume;
  std::function<void(const std::string&)> on_warning;
  // After a recovery, before the step is done again (Outcome::resized: this rank's place
  // changed, ctx.rank() and ctx.world_size() are the new ones; rank-dependent streams follow).
  std::function<void(const Recovery::Outcome&)> on_recovery;
};

template <typename Model>
class Recoverable {
 public:
  // `model` is a module holder (`Net model;`) or a std::shared_ptr to the module.
  Recoverable(Context& ctx, Model model, torch::optim::Optimizer& optimizer,
              RecoverableOptions options = {})
      : Recoverable(ctx, std::move(model), std::vector<torch::optim::Optimizer*>{&optimizer},
                    std::move(options)) {}
  // Several optimizers (a second model's, a GAN's discriminator's): each one's state is sent,
  // undone and checkpointed (the first's as the checkpoint's optimizer, the others' in its
  // training state); update() steps them all.
  Recoverable(Context& ctx, Model model, std::vector<torch::optim::Optimizer*> optimizers,
              RecoverableOptions options = {})
      : ctx_(ctx),
        model_(std::move(model)),
        optimizer_(*First(optimizers)),
        others_(optimizers.begin() + 1, optimizers.end()),
        options_(WithOthers(std::move(options), others_)),
        recovery_(ctx, *model_, optimizer_, options_.state, options_.recovery) {
    const auto t0 = std::chrono::steady_clock::now();
    if (recovery_.replacement()) {
      from_peer_ = true;
      start_ = recovery_.receive().step;
    } else if (options_.checkpoint) {
      auto warn = options_.on_warning ? options_.on_warning : [](const std::string& w) {
        std::fprintf(stderr, "dlrun::worker: warning: %s\n", w.c_str());
      };
      if (auto st = options_.checkpoint->resume_latest(*model_, optimizer_, ctx_,
                                                      options_.resume, warn)) {
        start_ = st->step;
        resumed_ = true;
        recovery_.restore_state(*st);
      }
    }
    resume_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    recovery_.commit(start_);
    Build();
  }
  Recoverable(const Recoverable&) = delete;
  Recoverable& operator=(const Recoverable&) = delete;

  // The wrapper of the current group: call it anew in each step (a recovery replaces it).
  DistributedDataParallel<Model>& ddp() { return *ddp_; }
  // The last step done when the object was made: resumed from the checkpoint or a peer, or 0.
  int64_t start_step() const { return start_; }
  // This process replaced a lost rank: its state came from a peer when it was made.
  bool replacement() const { return from_peer_; }
  // It resumed from a checkpoint when it was made; the seconds that took (or the peer's).
  bool resumed() const { return resumed_; }
  double resume_seconds() const { return resume_s_; }
  // The last whole step.
  int64_t committed() const { return recovery_.committed(); }
  Recovery& recovery() { return recovery_; }

  // The optimizer's update, in place of optimizer.step(), inside run()'s body: the one way to
  // write it (Recovery::update: what is waited for and copied; UpdateOptions: an update of the
  // trainer's own, and one that ends the step without the copy).
  void update(const UpdateOptions& options = {}) {
    if (options.apply || others_.empty()) return recovery_.update(options);
    UpdateOptions all = options;
    all.apply = [this] {
      optimizer_.step();
      for (torch::optim::Optimizer* o : others_) o->step();
    };
    recovery_.update(all);
  }

  // Runs body(step) for each step after committed() up to `last`; a step a peer's loss
  // interrupted is done again once every rank holds the state of the step before it.
  void run(int64_t last, const std::function<void(int64_t step)>& body) {
    for (int64_t step = recovery_.committed() + 1; step <= last; ++step) {
      const Recovery::Outcome r = recovery_.run([&] {
        body(step);
        if (recovery_.committed() != step) recovery_.commit(step);  // unless its update did
      });
      if (!r.recovered) continue;
      Build();
      step = r.step;  // the loop goes on with the step given up
      if (options_.on_recovery) options_.on_recovery(r);
    }
  }

  // The state a checkpoint of `step` holds: the trainer's (options.state.capture, the other
  // optimizers') and the step.
  TrainingState checkpoint_state(int64_t step) const {
    TrainingState st = recovery_.capture_state();
    st.step = step;
    st.world_size = ctx_.world_size();
    return st;
  }

 private:
  // The wrapper over ctx.pg: at the start, and after a recovery (the former one let go first,
  // its bucket order kept, every SyncBatchNorm moved onto the new group, the hook made anew).
  void Build() {
    DDPOptions o = options_.ddp;
    if (ddp_) {
      o.ready_order = ddp_->ready_order();
      ddp_.reset();
    }
    use_group(*model_, ctx_.pg);
    ddp_ = std::make_unique<DistributedDataParallel<Model>>(model_, ctx_.pg, o);
    if (options_.comm_hook) ddp_->register_comm_hook(options_.comm_hook(ctx_.pg));
  }

  static torch::optim::Optimizer* First(const std::vector<torch::optim::Optimizer*>& optimizers) {
    if (optimizers.empty() || optimizers.front() == nullptr) {
      throw std::invalid_argument("Recoverable: no optimizer given");
    }
    return optimizers.front();
  }
  static RecoverableOptions WithOthers(RecoverableOptions o,
                                      const std::vector<torch::optim::Optimizer*>& others) {
    o.state.optimizers.insert(o.state.optimizers.end(), others.begin(), others.end());
    return o;
  }

  Context& ctx_;
  Model model_;
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::optim::Optimizer*> others_;
  RecoverableOptions options_;
  Recovery recovery_;
  int64_t start_ = 0;
  bool from_peer_ = false, resumed_ = false;
  double resume_s_ = 0;
  std::unique_ptr<DistributedDataParallel<Model>> ddp_;
};

}  // namespace dlrun::worker
