// train_unet's Trainer (trainer.cc: set-up, the run, the end) and its Steps (trainer_step.cc: the
// step and its micro-steps, benchy, validation and the per-epoch report). Internal to
// dlrun_unet: the program's entry point is trainer.h's TrainUnetMain.
#pragma once
#include <time.h>
#include <unistd.h>

#include <iterator>
#include <sstream>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <limits>
#include <optional>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/contract.h"
#include "common/cpus.h"
#include "dlrun/agent_link.h"
#include "dlrun/checkpoint.h"
#include "dlrun/ddp.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/recoverable.h"
#include "dlrun/worker.h"
#include "nlohmann/json.hpp"
#include "unet/batch_feed.h"
#include "unet/data.h"
#include "unet/gpu.h"
#include "unet/tensorboard.h"
#include "unet/train_args.h"
#include "unet/trainer.h"
#include "unet/unet.h"
#include "worker/src/text.h"

namespace train_unet_internal {

using dlrun::examples::TrainArgs;
namespace lite = dlrun::lite;  // worker/src/text.h: abseil's names, the standard library only

// The tutorial's loss: L1, plus lambda_rho x L1 of exp(14 x) on channel 0 (the density), which
// weights the dense regions.
torch::Tensor Loss(const torch::Tensor& gen, const torch::Tensor& tar, double lambda_rho);

// SIGUSR1 (e.g. Slurm's --signal=USR1@90 before preemption, forwarded by dlrun): checkpoint at
// the end of the current step.
extern std::atomic<bool> g_checkpoint_requested;
void OnSigusr1(int);

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since);
// Seconds since this process started (its exec, before LibTorch was loaded), from
// /proc/self/stat's start time in clock ticks since boot; -1 if unknown.
double SecondsSinceProcessStart();
// This process' peak resident memory (VmHWM), bytes; 0 when unreadable.
int64_t PeakRssBytes();

// The Trainer's state in plain groups.
struct Sizes {
  int64_t global_batch = 1, steps_per_epoch = 1, val_steps = 0, nparams = 0;
};
struct Progress {
  Clock::time_point t0, start, epoch_start;
  double first_loss = 0, last_loss = 0, lr = 0, epoch_loss = 0;
  int64_t epoch_steps = 0;
  int64_t target_step = -1;  // --target-loss: the step where it was first reached
  double target_s = -1;
  std::string target_of;  // "validation" or "training" loss
};
struct Threads {
  int loader = 0, intra = 0, cpus_per_rank = 0;
};

// One training run's state, shared by its set-up and end (Trainer, trainer.cc) and its steps
// (Steps, trainer_step.cc).
struct TrainState {
  TrainArgs a;
  dlrun::worker::Context ctx;
  double init_done_s = -1;  // process start (a spare: its promotion) -> init() done
  int rank = 0, world = 1;
  torch::Device device{torch::kCPU};
  bool channels_last = false;
  dlrun::examples::UNet model{nullptr};
  std::unique_ptr<dlrun::examples::GradScaler> scaler;
  std::vector<torch::Tensor> params;
  uint64_t initial_digest = 0;
  std::unique_ptr<torch::optim::Adam> opt;
  dlrun::worker::LrSchedule sched;
  std::optional<dlrun::worker::CheckpointManager> ckpt;
  int64_t start_step = 0;
  // The resume, the DDP wrapper and in-process recovery (docs/RECOVERY.md): a lost rank costs
  // the step it interrupted.
  std::optional<dlrun::worker::Recoverable<dlrun::examples::UNet>> rec;
  std::unique_ptr<dlrun::examples::EventWriter> tb;
  Sizes sizes;
  BatchFeed data;
  Progress progress;
  Threads threads;
  std::unique_ptr<dlrun::examples::CpuAllocationPeak> cpu_peak;  // over the training steps

  dlrun::worker::DistributedDataParallel<dlrun::examples::UNet>& ddp() { return rec->ddp(); }
};

// The steps of a run (trainer_step.cc): each step's micro-steps and update, the per-epoch
// report with its validation, the checkpoints, and benchy's throughput trials.
class Steps {
 public:
  explicit Steps(TrainState& s) : s_(s) {}
  void Step(int64_t step);
  void EndOfEpoch(int64_t step);
  int Benchy();
  void Save(int64_t step);
  // In a process that replaced rank 0: the checkpoint of the step it took from a peer, when that
  // is a checkpoint step and its file is missing (the lost rank 0 died after the step's commit,
  // before its save; the step is not done again, so its save would never come).
  void SaveIfLost(int64_t step);

 private:
  torch::Tensor MicroStep(int64_t step, bool sync, double* data_s);
  void AfterStep(int64_t step, double mean_loss, bool signalled);
  double Validate();
  void TrainStep(const torch::Tensor& x, const torch::Tensor& y);

  TrainState& s_;
};

// One training run (trainer.cc): set up (model, optimiser, schedule, checkpoint resume, DDP,
// data), then the steps (Steps) with their per-epoch reports, or benchy's trials, then the end.
class Trainer {
 public:
  explicit Trainer(TrainArgs a) { s_.a = std::move(a); }
  int Run();

 private:
  void Init();
  void ResolveSizes();
  void BuildModel(int local_rank);
  void BuildSchedule();
  void Resume();
  void OpenData(int64_t at_step);
  void AfterRecovery(const dlrun::worker::Recovery::Outcome& r);
  void PrintHeader();
  void SetThreads(int local_world_size);
  int Finish();

  TrainState s_;
  Steps steps_{s_};
};

}  // namespace train_unet_internal
