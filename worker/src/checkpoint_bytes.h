// A checkpoint as bytes in memory (the file's layout: header with checksum, then payload), for
// the state transfer of in-process recovery (recovery.cc). Internal to the worker library.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "dlrun/checkpoint.h"

namespace dlrun::worker::detail {

std::string CheckpointBytes(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                            const TrainingState& state);
// What is wrong with `data` (bad magic, length, checksum); empty when intact.
std::string CheckpointBytesProblem(const std::string& data);
// Intact bytes into the model and optimizer in place (and the CPU RNG); throws when they are
// another model's, leaving the model as it was.
void LoadCheckpointBytesInPlace(const std::string& data, torch::nn::Module& model,
                                torch::optim::Optimizer& optimizer, TrainingState* st);
// The training state alone (step, positions, the trainer's tensors and values, the CPU RNG) as
// bytes, and back (restoring this process' CPU RNG), for the state transfer's small part.
std::string TrainingStateBytes(const TrainingState& state);
TrainingState TrainingStateFromBytes(const std::string& bytes);

}  // namespace dlrun::worker::detail
