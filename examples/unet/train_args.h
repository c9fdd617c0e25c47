// train_unet's command line: its flags (CLI11) and the tutorial's named YAML configurations.
#pragma once

#include <cstdint>
#include <string>

namespace dlrun::examples {

struct TrainArgs {
  bool synthetic = false;
  int64_t base_channels = 16;
  int64_t data_size = 64;
  int64_t local_batch_size = 1;
  int64_t max_steps = 10;
  int64_t warmup_steps = 1;  // steps excluded from the samples/s figure
  double lr = 1e-3;
  uint64_t seed = 1234;
  bool grad_sync = true;
  double bucket_cap_mb = 25;
  bool broadcast_buffers = true;
  bool fp16_grad_compression = false;
  std::string metrics_json;
  std::string data;  // HDF5 file (instead of --synthetic)
  std::string data_mode = "inmem";
  int num_data_workers = 2;
  int prefetch_factor = 4;  // the DGX guide's default (seeds/000)
  bool num_data_workers_given = false;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0: only at the end and on SIGUSR1
  std::string lr_scaling = "none";
  int64_t base_batch_size = 0;  // 0: the global batch (no scaling)
  int64_t lr_warmup_steps = 0;
  double end_lr = 0;
  int64_t fail_at_step = 0;  // fault injection for restart tests: exit 1 at this step once
  std::string fail_how = "exit";  // --fail-at-step: "exit" (exit 1), "kill" or "stop" (SIGSTOP)
  // Fault injection for in-process recovery's fallbacks: the process that replaces a lost rank
  // "hangs" (never joins) or "differs" (takes the state, then changes a parameter).
  std::string fail_replacement;
  // From --config (the tutorial's epochs): 0 = not set.
  int64_t num_epochs = 0;
  int64_t nsamples = 0;      // training samples per epoch
  int64_t nsamples_val = 0;  // validation samples per epoch
  int64_t global_batch_size = 0;
  std::string val_path;
  bool max_steps_given = false, local_batch_given = false;
  double lambda_rho = 0;
  bool benchy = false;
  int benchy_trials = 3;  // trials per benchy mode: mean +/- spread
  int64_t accumulation_steps = 1;  // micro-batches per optimizer step (DDP no-sync for K-1)
  bool checkpoint_activations = false;
  bool measure_allocations = false;  // CPU: peak_allocated_bytes in metrics.json
  bool tf32 = true;                // TF32 matmul/convolutions on CUDA (--no-tf32: off)
  bool deterministic = false;      // CUDA: deterministic cuDNN and algorithms, no autotuning
  double target_loss = -1;         // > 0: record when the validation loss first reaches it
  bool rotate_on_device = true;    // the 24-rotation augmentation after the upload
  std::string tensorboard_dir;
  std::string device = "auto";  // auto | cpu | cuda
  bool amp = true;               // mixed precision, on CUDA only
  int64_t inject_inf_step = 0;   // > 0: an inf in the loss at this step (scripts/gpu-check)
  int channels_last = -1;        // -1: on CUDA only
};

// Parses train_unet's flags, then fills what they left unset from --config (the YAML file of
// named configurations). Returns -1 to go on, else the exit code: 0 after --help, 2 after bad
// input (the one-line message is printed).
int ParseTrainArgs(int argc, char** argv, TrainArgs* a);

}  // namespace dlrun::examples
