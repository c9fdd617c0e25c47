// Checkpoints for elastic restarts: model + optimizer + step + epoch + position in the epoch +
// the CPU RNG + whatever named tensors and values the trainer adds, written atomically (temp
// file, fsync, rename, fsync of the directory) with a checksum, the newest `keep_last` kept.
// resume_latest() loads the newest checkpoint that verifies and skips a damaged one with a
// warning: a damaged file is never loaded.
//
//   dlrun::worker::CheckpointManager ckpt({.dir = "ckpt"});
//   dlrun::worker::TrainingState st{.step = step, .epoch = epoch, .epoch_position = b};
//   st.tensors["ema.weight"] = ema_weight;           // extra state: tensors ...
//   st.values["best_loss"] = best_loss;              // ... and values (any c10::IValue)
//   if (ctx.rank() == 0) ckpt.save(*model, opt, st); // throws std::runtime_error on failure
//   if (auto resumed = ckpt.resume_latest(*model, opt, ctx)) step = resumed->step;
//
// The model is loaded in place (each parameter and buffer copied into the tensor it already
// has), as PyTorch's load_state_dict does, so a DistributedDataParallel wrapping it and an
// optimizer holding its parameters stay valid.
//
// File layout: "DLRUNCK1" | payload length (u64 LE) | FNV-1a 64 of the payload (u64 LE) |
// payload (a torch::serialize archive).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dlrun::worker {

struct TrainingState {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t sampler_epoch = 0;
  // How far into `epoch` training got, in the trainer's own unit (e.g. this rank's samples,
  // DataLoaderSampler::position()): a resume goes on from there (DataLoaderSampler::set_start,
  // or the index loop's start) instead of the epoch's first sample.
  int64_t epoch_position = 0;
  // The world size the checkpoint was written at (0: not recorded). With it, the collective
  // resume at another world size converts epoch_position, taken as this rank's samples of a
  // DistributedSampler-style split (rank r takes indices r, r + W, ...): p samples per rank at
  // W ranks are p x W global, p x W / W' per rank at W'. It says so in one line, and refuses
  // (throws) when p x W does not divide by W'.
  int world_size = 0;
  // Anything else the trainer keeps: EMA weights, a second model's parameters, another RNG's
  // state (named tensors), counters and settings (ints, doubles, strings: any c10::IValue).
  std::map<std::string, torch::Tensor> tensors{};
  std::map<std::string, c10::IValue> values{};
};

struct Context;  // dlrun/worker.h

struct ResumeOptions {
  // No rank holding a usable checkpoint is an error (std::runtime_error naming the directory)
  // instead of a fresh start: for a run that must not silently begin again at step 0.
  bool strict = false;
};

struct CheckpointOptions {
  std::string dir;
  int keep_last = 3;
};

class CheckpointManager {
 public:
  explicit CheckpointManager(CheckpointOptions options);
  // Writes checkpoint `state.step` (call it on one rank, e.g. rank 0). Also saves the CPU RNG.
  // Throws std::runtime_error naming the file and the system's error when it cannot write;
  // the previous checkpoints are then untouched.
  void save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
            const TrainingState& state);
  // Loads the newest valid checkpoint into model and optimizer in place (and restores the CPU
  // RNG), and returns its state with the extra tensors and values. nullopt when there is none;
  // damaged files, or files of another model, are reported through `warn` (default: stderr)
  // and skipped. For one process: in a job of several ranks (WORLD_SIZE, OMPI_COMM_WORLD_SIZE
  // or SLURM_NTASKS above 1) it throws std::logic_error naming the collective form, for ranks
  // that resume alone from node-local directories resume at different steps and hang.
  std::optional<TrainingState> resume_latest(
      torch::nn::Module& model, torch::optim::Optimizer& optimizer,
      const std::function<void(const std::string&)>& warn = {});
  // The same, as a resume every rank agrees on: call it on every rank (a collective over
  // `ctx`, in the same order as the trainer's other collectives). Each rank looks in its own
  // directory, shared between nodes or node-local: the newest step any rank holds an intact
  // checkpoint of wins, and the lowest rank holding it sends the file to every rank in one
  // broadcast. Every rank loads it in place and the ranks' parameter digests are compared; a
  // rank that resumed from another rank's file says so through `warn`. nullopt on every rank
  // when no rank has one (ResumeOptions::strict: throws). Throws a one-line
  // std::runtime_error when the file arrived damaged, is another model's, or the ranks differ.
  std::optional<TrainingState> resume_latest(
      torch::nn::Module& model, torch::optim::Optimizer& optimizer, const Context& ctx,
      const ResumeOptions& options = {},
      const std::function<void(const std::string&)>& warn = {});
  // Checkpoint files, newest first.
  std::vector<std::string> list() const;
  // Whether a checkpoint file of `step` is in the directory (whether it verifies is resume's
  // question).
  bool holds(int64_t step) const;

 private:
  CheckpointOptions o_;
};

}  // namespace dlrun::worker
