// The train_unet program: the SC22 tutorial's U-Net trainer on LibTorch + dlrun::worker.
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

#include "dlrun/agent_link.h"
#include "dlrun/checkpoint.h"
#include "dlrun/ddp.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/worker.h"
#include "nlohmann/json.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cpus.h"
#include "unet/data.h"
#include "unet/gpu.h"
#include "unet/tensorboard.h"
#include "unet/train_args.h"
#include "unet/trainer.h"
#include "unet/unet.h"

namespace {

using dlrun::examples::TrainArgs;

// The tutorial's loss: L1, plus lambda_rho x L1 of exp(14 x) on channel 0 (the density), which
// weights the dense regions.
torch::Tensor Loss(const torch::Tensor& gen, const torch::Tensor& tar, double lambda_rho) {
  torch::Tensor loss = torch::l1_loss(gen, tar);
  if (lambda_rho > 0) {
    loss = loss + lambda_rho * torch::l1_loss(torch::exp(14 * gen.select(1, 0)),
                                              torch::exp(14 * tar.select(1, 0)));
  }
  return loss;
}

// SIGUSR1 (e.g. Slurm's --signal=USR1@90 before preemption, forwarded by dlrun): checkpoint at
// the end of the current step.
std::atomic<bool> g_checkpoint_requested{false};
void OnSigusr1(int) { g_checkpoint_requested = true; }

// Synthetic pairs with a learnable relation: the target is tanh of a fixed per-voxel mix of the
// input channels, so the loss falls as the model trains. Each rank draws its own samples.
struct SyntheticData {
  torch::Tensor mix;  // [out, in]
  torch::Generator gen;
  int64_t size;
  SyntheticData(int64_t size, uint64_t seed, int rank) : size(size) {
    torch::manual_seed(seed);
    mix = torch::randn({5, 4}) * 0.5;
    gen = torch::make_generator<torch::CPUGeneratorImpl>(seed * 7919 + rank + 1);
  }
  std::pair<torch::Tensor, torch::Tensor> Batch(int64_t n) {
    auto x = torch::randn({n, 4, size, size, size}, gen);
    auto y = torch::tanh(torch::einsum("oi,nidhw->nodhw", {mix, x}));
    return {x, y};
  }
};

using Clock = std::chrono::steady_clock;
using Batch = std::pair<torch::Tensor, torch::Tensor>;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Seconds since this process started (its exec, before LibTorch was loaded), from
// /proc/self/stat's start time in clock ticks since boot; -1 if unknown.
double SecondsSinceProcessStart() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  for (int i = 3; i < 22 && fields >> f; ++i) {
  }
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return -1;
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9 -
         static_cast<double>(start_ticks) / ticks;
}

// This process' peak resident memory (VmHWM), bytes; 0 when unreadable.
int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

// One training run: set up (model, optimiser, schedule, checkpoint resume, DDP, data), then the
// step loop with its per-epoch reports, or benchy's throughput trials.
class Trainer {
 public:
  explicit Trainer(TrainArgs a)
      : a_(std::move(a)), ctx_(dlrun::worker::init()) {
    init_done_s_ = ctx_.promoted_at ? Seconds(*ctx_.promoted_at) : SecondsSinceProcessStart();
  }
  int Run();

 private:
  void ResolveSizes();
  void BuildModel();
  void BuildSchedule();
  void Resume();
  void OpenData();
  void PrintHeader();
  int Benchy();
  void SetThreads();
  void Step(int64_t step);
  torch::Tensor MicroStep(int64_t step, bool sync, double* data_s);
  void AfterStep(int64_t step, double mean_loss, bool signalled);
  void EndOfEpoch(int64_t step);
  int Finish();
  torch::Tensor ToDevice(torch::Tensor t) const;
  Batch NextBatch();
  Batch TakeBatch();
  Batch NextValBatch();
  double Validate();
  void Save(int64_t step);
  void TrainStep(const torch::Tensor& x, const torch::Tensor& y);

  TrainArgs a_;
  dlrun::worker::Context ctx_;
  double init_done_s_ = -1;  // process start (a spare: its promotion) -> init() done
  int rank_ = 0, world_ = 1;
  int64_t global_batch_ = 1, steps_per_epoch_ = 1, val_steps_ = 0, nparams_ = 0;
  torch::Device device_{torch::kCPU};
  bool channels_last_ = false;
  dlrun::examples::UNet model_{nullptr};
  std::unique_ptr<dlrun::examples::GradScaler> scaler_;
  std::vector<torch::Tensor> params_;
  uint64_t initial_digest_ = 0;
  std::unique_ptr<torch::optim::Adam> opt_;
  dlrun::worker::LrSchedule sched_;
  std::optional<dlrun::worker::CheckpointManager> ckpt_;
  int64_t start_step_ = 0;
  std::unique_ptr<dlrun::worker::DistributedDataParallel<dlrun::examples::UNet>> ddp_;
  std::unique_ptr<SyntheticData> synthetic_, synthetic_val_;
  std::unique_ptr<dlrun::examples::Prefetcher> loader_, loader_val_;
  std::unique_ptr<dlrun::examples::EventWriter> tb_;
  // Progress.
  Clock::time_point t0_, start_, epoch_start_;
  double first_loss_ = 0, last_loss_ = 0, lr_ = 0, epoch_loss_ = 0;
  int64_t epoch_steps_ = 0;
  std::optional<Batch> prefetched_;  // CUDA: the next batch, copied during this step
  std::unique_ptr<dlrun::examples::CpuAllocationPeak> cpu_peak_;  // over the training steps
  int loader_threads_ = 0, intra_threads_ = 0, cpus_per_rank_ = 0;
  int64_t target_step_ = -1;  // --target-loss: the step where it was first reached
  double target_s_ = -1;
  std::string target_of_;     // "validation" or "training" loss
};

void Trainer::ResolveSizes() {
  rank_ = ctx_.rank();
  world_ = ctx_.worldSize();
  if (a_.global_batch_size > 0 && !a_.local_batch_given) {
    if (a_.global_batch_size % world_ != 0) {
      throw std::runtime_error(absl::StrCat("global_batch_size ", a_.global_batch_size,
                                            " does not split over ", world_,
                                            " ranks: expected a multiple of the world size"));
    }
    a_.local_batch_size = a_.global_batch_size / world_;
  }
  // The global (effective) batch of one optimizer step: K micro-batches on every rank. The LR
  // scaling, the epochs and samples/s count it.
  global_batch_ = a_.local_batch_size * world_ * a_.accumulation_steps;
  // Epochs as in the tutorial: Nsamples per epoch over the global batch; without a config an
  // epoch is --max-steps steps (the whole run unless --num-epochs says more).
  steps_per_epoch_ = a_.nsamples > 0 ? std::max<int64_t>(1, a_.nsamples / global_batch_) : a_.max_steps;
  if (a_.num_epochs > 0 && (a_.nsamples == 0 || !a_.max_steps_given)) {
    a_.max_steps = a_.num_epochs * steps_per_epoch_;
  }
  if (a_.warmup_steps >= a_.max_steps) a_.warmup_steps = 0;
  val_steps_ = a_.nsamples_val > 0 ? std::max<int64_t>(1, a_.nsamples_val / global_batch_) : 0;
}

void Trainer::BuildModel() {
  torch::manual_seed(a_.seed);  // identical init everywhere; rank 0's values are broadcast anyway
  model_ = dlrun::examples::UNet(
      dlrun::examples::UNetOptions{4, 5, a_.base_channels, a_.checkpoint_activations});
  // The GPU path (never run here: no GPU): the rank's device, cuDNN/TF32, channels-last,
  // autocast with loss scaling. On the CPU only channels-last can be asked for.
  device_ = dlrun::examples::PickDevice(a_.device, ctx_.env.local_rank);
  dlrun::examples::ConfigureBackends(device_, a_.tf32);
  model_->to(device_);
  channels_last_ = a_.channels_last < 0 ? device_.is_cuda() : a_.channels_last > 0;
  if (channels_last_) dlrun::examples::ToChannelsLast(model_->parameters());
  scaler_ = std::make_unique<dlrun::examples::GradScaler>(a_.amp && device_.is_cuda());
  params_ = model_->parameters();
  initial_digest_ = dlrun::worker::digest(params_);
  for (const auto& p : params_) nparams_ += p.numel();
  opt_ = std::make_unique<torch::optim::Adam>(params_, torch::optim::AdamOptions(a_.lr));
}

void Trainer::BuildSchedule() {
  sched_.start_lr = a_.lr;
  sched_.end_lr = a_.end_lr;
  sched_.tot_steps = a_.max_steps;
  sched_.warmup_steps = a_.lr_warmup_steps;
  sched_.global_batch_size = global_batch_;
  sched_.base_batch_size = a_.base_batch_size > 0 ? a_.base_batch_size : global_batch_;
  sched_.scaling = a_.lr_scaling;
  dlrun::worker::Validate(sched_);
  if (rank_ == 0) {
    for (const std::string& note : dlrun::worker::IneffectiveSettings(sched_)) {
      std::fprintf(stderr, "train_unet: note: %s\n", note.c_str());
    }
  }
  lr_ = a_.lr;
}

// Resume after an elastic restart or a requeue: every rank loads the newest valid checkpoint
// (the directory must be shared between nodes). Then wrap in DDP, as with PyTorch: DDP starts
// from rank 0's resumed parameters.
void Trainer::Resume() {
  if (!a_.checkpoint_dir.empty()) {
    ckpt_.emplace(dlrun::worker::CheckpointOptions{.dir = a_.checkpoint_dir, .keep_last = 3});
    const auto load_start = Clock::now();
    auto resumed = ckpt_->resumeLatest(*model_, *opt_, [&](const std::string& w) {
      std::fprintf(stderr, "train_unet: warning: %s\n", w.c_str());
    });
    if (resumed.has_value()) {
      start_step_ = resumed->step;
      if (rank_ == 0) {
        // The restart's phases inside the worker (bench/recovery reads them).
        std::printf("resumed from step %ld (%s to init() done %.3f s, checkpoint load %.3f s)\n",
                    start_step_, ctx_.promoted_at ? "promotion" : "process start", init_done_s_,
                    Seconds(load_start));
      }
    }
  }
  dlrun::worker::DDPOptions ddp_opts;
  ddp_opts.bucket_cap_mb = a_.bucket_cap_mb;
  ddp_opts.broadcast_buffers = a_.broadcast_buffers;
  ddp_opts.fp16_compression = a_.fp16_grad_compression;
  ddp_ = std::make_unique<dlrun::worker::DistributedDataParallel<dlrun::examples::UNet>>(model_, ctx_.pg, ddp_opts);
  std::signal(SIGUSR1, OnSigusr1);
}

void Trainer::OpenData() {
  auto open_loader = [&](const std::string& path, uint64_t seed) {
    auto src = dlrun::examples::CropSource::Open(path, a_.data_size, a_.data_mode == "inmem");
    if (!src.ok()) throw std::runtime_error(std::string(src.status().message()));
    return std::make_unique<dlrun::examples::Prefetcher>(
        std::shared_ptr<dlrun::examples::CropSource>(std::move(*src)), loader_threads_,
        a_.prefetch_factor, seed, /*rotate_in_loader=*/!a_.rotate_on_device);
  };
  if (a_.data.empty()) {
    synthetic_ = std::make_unique<SyntheticData>(a_.data_size, a_.seed, rank_);
    if (a_.nsamples_val > 0) {
      synthetic_val_ = std::make_unique<SyntheticData>(a_.data_size, a_.seed, 7777 + rank_);
    }
  } else {
    loader_ = open_loader(a_.data, a_.seed * 7919 + rank_ + 1 + start_step_ * 1000003);
    if (a_.nsamples_val > 0) {
      loader_val_ = open_loader(a_.val_path.empty() ? a_.data : a_.val_path, a_.seed * 31 + rank_ + 1);
    }
  }
  if (!a_.tensorboard_dir.empty() && rank_ == 0) {
    auto w = dlrun::examples::EventWriter::Open(a_.tensorboard_dir);
    if (!w.ok()) throw std::runtime_error(std::string(w.status().message()));
    tb_ = std::move(*w);
  }
}

void Trainer::PrintHeader() {
  if (rank_ != 0) return;
  std::printf("train_unet: %d rank(s), base width %ld (%.2f M parameters), %ld^3 crops, "
              "local batch %ld, %d thread(s) per rank, gradient sync %s, device %s%s%s\n",
              world_, a_.base_channels, nparams_ / 1e6, a_.data_size, a_.local_batch_size,
              torch::get_num_threads(), a_.grad_sync ? "on" : "off", device_.str().c_str(),
              scaler_->enabled() ? ", AMP" : "", channels_last_ ? ", channels-last" : "");
  std::printf("threads per rank: %d loader + %d intra-op (%d CPU(s) per rank)%s%s%s%s\n",
              loader_threads_, intra_threads_, cpus_per_rank_,
              a_.accumulation_steps > 1
                  ? absl::StrCat(", ", a_.accumulation_steps, " micro-batches per step (effective "
                                 "global batch ", global_batch_, ")").c_str()
                  : "",
              a_.checkpoint_activations ? ", activation checkpointing" : "",
              device_.is_cuda() && !a_.tf32 ? ", TF32 off" : "",
              loader_ && a_.rotate_on_device ? ", rotations on the device" : "");
  std::printf("%s\n", ddp_->bucketReport().c_str());
  std::fflush(stdout);
}

// The thread budget: a rank's loader threads plus its intra-op threads fit the CPUs allocated
// to it (the CPUs this process may use, over the ranks of this node), unless the user chose
// the loader threads. Synthetic data needs no loader threads.
void Trainer::SetThreads() {
  const dlrun::CpuAllocation cpus = dlrun::AllocatedCpus();
  const int local_world = std::max(1, ctx_.env.local_world_size);
  cpus_per_rank_ = std::max(1, static_cast<int>(cpus.cpus / local_world));
  loader_threads_ = a_.data.empty() ? 0 : a_.num_data_workers;
  if (loader_threads_ > 0 && !a_.num_data_workers_given) {
    loader_threads_ = std::clamp(cpus_per_rank_ - 1, 1, a_.num_data_workers);
  }
  intra_threads_ = std::max(1, std::min(torch::get_num_threads(), cpus_per_rank_ - loader_threads_));
  torch::set_num_threads(intra_threads_);
}

torch::Tensor Trainer::ToDevice(torch::Tensor t) const {
  t = dlrun::examples::ToDeviceAsync(t, device_);
  return channels_last_ ? t.contiguous(torch::MemoryFormat::ChannelsLast3d) : t;
}

// A batch on the device: uploaded first, then rotated there (the 24-rotation augmentation)
// unless --rotate-in-loader.
Batch Trainer::NextBatch() {
  if (!loader_) {
    Batch b = synthetic_->Batch(a_.local_batch_size);
    return {ToDevice(b.first), ToDevice(b.second)};
  }
  dlrun::examples::HostBatch b = loader_->NextBatch(a_.local_batch_size);
  return {ToDevice(dlrun::examples::RotateBatch(dlrun::examples::ToDeviceAsync(b.input, device_), b.rotations)),
          ToDevice(dlrun::examples::RotateBatch(dlrun::examples::ToDeviceAsync(b.target, device_), b.rotations))};
}

// The batch this micro-step trains on: on CUDA the one fetched and copied during the step
// before (its host-to-device copy on a side stream overlapped that step's compute).
Batch Trainer::TakeBatch() {
  if (prefetched_) {
    Batch b = std::move(*prefetched_);
    prefetched_.reset();
    return b;
  }
  return NextBatch();
}

Batch Trainer::NextValBatch() {
  Batch b = loader_val_ ? loader_val_->Next(a_.local_batch_size)
                        : synthetic_val_->Batch(a_.local_batch_size);
  return {ToDevice(b.first), ToDevice(b.second)};
}

double Trainer::Validate() {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t i = 0; i < val_steps_; ++i) {
    auto [x, y] = NextValBatch();
    dlrun::examples::AutocastScope autocast(scaler_->enabled());
    sum += Loss(model_->forward(x), y, a_.lambda_rho).item<double>();
  }
  std::vector<torch::Tensor> t{torch::tensor({sum / std::max<int64_t>(1, val_steps_)},
                                             torch::TensorOptions().device(device_))};
  if (world_ > 1) ctx_.pg->allreduce(t)->wait();
  return t[0].item<double>() / world_;
}

void Trainer::Save(int64_t step) {
  if (!ckpt_ || rank_ != 0) return;
  try {
    ckpt_->save(*model_, *opt_, {.step = step});
    std::printf("checkpoint saved at step %ld\n", step);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "train_unet: checkpoint failed: %s\n", e.what());
  }
}

// benchy's step: forward, backward through DDP, optimiser step.
void Trainer::TrainStep(const torch::Tensor& x, const torch::Tensor& y) {
  opt_->zero_grad(/*set_to_none=*/true);
  torch::Tensor loss;
  {
    dlrun::examples::AutocastScope autocast(scaler_->enabled());
    loss = Loss((*ddp_)(x), y, a_.lambda_rho);
  }
  scaler_->scale(loss).backward();
  const bool finite = scaler_->unscale(params_);
  if (finite) opt_->step();
  scaler_->update(finite);
}

// benchy's three trials: the loader alone (IO), the model on one cached batch (SYNTHETIC), and
// normal training (FULL); FULL is bounded by the slower of the first two.
int Trainer::Benchy() {
  // Each mode: --benchy-trials trials of --max-steps steps (samples/s of all ranks), reported
  // as benchy does: the mean +/- the standard deviation over the trials.
  const int64_t batch = a_.local_batch_size * world_;
  struct Trial {
    double mean = 0, spread = 0;
  };
  auto trial = [&](const char* mode, const std::function<void()>& step) {
    step();  // warm-up
    std::vector<double> rates;
    for (int k = 0; k < a_.benchy_trials; ++k) {
      if (world_ > 1) ctx_.pg->barrier()->wait();
      const auto t = Clock::now();
      for (int64_t i = 0; i < a_.max_steps; ++i) step();
      if (world_ > 1) ctx_.pg->barrier()->wait();
      rates.push_back(static_cast<double>(a_.max_steps * batch) / Seconds(t));
      if (rank_ == 0) std::printf("BENCHY::%s trial %d: %.3f samples/s\n", mode, k + 1, rates.back());
    }
    Trial r;
    for (double v : rates) r.mean += v / static_cast<double>(rates.size());
    for (double v : rates) r.spread += (v - r.mean) * (v - r.mean) / static_cast<double>(rates.size());
    r.spread = std::sqrt(r.spread);
    return r;
  };
  const Trial io_t = trial("IO", [&] { NextBatch(); });
  auto cached = NextBatch();
  const Trial synth_t = trial("SYNTHETIC", [&] { TrainStep(cached.first, cached.second); });
  const Trial full_t = trial("FULL", [&] {
    auto b = NextBatch();
    TrainStep(b.first, b.second);
  });
  const double io = io_t.mean, synth = synth_t.mean;
  if (rank_ == 0) {
    std::printf("BENCHY::SUMMARY::IO average trial throughput: %.3f +/- %.3f\n", io_t.mean, io_t.spread);
    std::printf("BENCHY::SUMMARY:: SYNTHETIC average trial throughput: %.3f +/- %.3f\n",
                synth_t.mean, synth_t.spread);
    std::printf("BENCHY::SUMMARY::FULL average trial throughput: %.3f +/- %.3f\n", full_t.mean,
                full_t.spread);
    std::printf("FULL is bounded by %s: %s (%.3f) is slower than %s (%.3f) samples/s\n",
                io < synth ? "data loading" : "compute", io < synth ? "IO" : "SYNTHETIC",
                std::min(io, synth), io < synth ? "SYNTHETIC" : "IO", std::max(io, synth));
  }
  return 0;
}

// One micro-step: a batch, forward, backward. The gradients add up in .grad over the
// micro-steps; only the one with `sync` all-reduces them (DDP's no_sync for the others, as
// PyTorch's gradient accumulation). The loss is divided by the micro-steps, so K micro-batches
// of b give the gradient of one batch of K x b. Returns the (undivided) loss.
torch::Tensor Trainer::MicroStep(int64_t step, bool sync, double* data_s) {
  const auto wait_start = Clock::now();
  auto [x, y] = [&] {
    dlrun::worker::ScopedRange r("data wait");
    return TakeBatch();
  }();
  *data_s += Seconds(wait_start);
  std::optional<dlrun::worker::DistributedDataParallelBase::NoSyncGuard> local_only;
  if (!sync) local_only.emplace(ddp_.get());
  torch::Tensor loss;
  {
    dlrun::worker::ScopedRange r("forward");
    dlrun::examples::AutocastScope autocast(scaler_->enabled());
    // Without gradient sync at all (benchmarks): the model itself, gradients stay local.
    loss = Loss(a_.grad_sync ? (*ddp_)(x) : model_->forward(x), y, a_.lambda_rho);
  }
  // --inject-inf-step: an overflow on purpose (every gradient becomes inf or NaN).
  if (step == a_.inject_inf_step) loss = loss * std::numeric_limits<float>::infinity();
  dlrun::worker::ScopedRange r("backward");
  const double k = static_cast<double>(a_.accumulation_steps);
  scaler_->scale(k > 1 ? loss / k : loss).backward();  // with sync: averaged over ranks on return
  // CUDA: the next batch's host-to-device copy goes on its side stream now, while this step's
  // kernels run (no effect on the CPU, where the copy is the batch itself).
  if (device_.is_cuda() && (step < a_.max_steps || !sync)) prefetched_ = NextBatch();
  return loss.detach();
}

// One training step: K micro-steps, the optimizer step. The loss is averaged over ranks, and
// the same allreduce tells every rank whether any rank was asked to checkpoint (SIGUSR1), so
// every rank decides alike.
void Trainer::Step(int64_t step) {
  if (step == a_.fail_at_step && ctx_.env.restart_count == 0 && rank_ == world_ - 1) {
    std::fprintf(stderr, "train_unet: --fail-at-step %ld: exiting as asked\n", step);
    std::exit(1);
  }
  const auto step_start = Clock::now();
  // NVTX ranges for nsys (dlrun/ranges.h): the step, and its data wait, forward, backward (the
  // buckets' all-reduce ranges start inside it) and optimizer step; the checkpoint after it.
  std::optional<dlrun::worker::ScopedRange> step_range(std::in_place, "step", step);
  lr_ = dlrun::worker::LearningRate(sched_, step - 1);
  dlrun::worker::SetLearningRate(*opt_, lr_);
  opt_->zero_grad(/*set_to_none=*/true);  // the DGX guide's: no memset, fresh gradients
  double data_s = 0;
  torch::Tensor loss_sum;
  for (int64_t m = 0; m < a_.accumulation_steps; ++m) {
    const bool last = m + 1 == a_.accumulation_steps;
    torch::Tensor l = MicroStep(step, a_.grad_sync && last, &data_s);
    loss_sum = m == 0 ? l.to(torch::kFloat32) : loss_sum + l.to(torch::kFloat32);
  }
  const torch::Tensor loss = loss_sum / static_cast<double>(a_.accumulation_steps);
  std::optional<dlrun::worker::ScopedRange> opt_range(std::in_place, "optimizer step");
  const bool finite = scaler_->unscale(params_);
  if (finite) opt_->step();  // an overflow under AMP skips the step on every rank alike
  opt_range.reset();
  if (!finite && rank_ == 0) {
    std::printf("step %ld: non-finite gradients, step skipped%s\n", step,
                scaler_->enabled() ? " by the loss scaler" : "");
  }
  scaler_->update(finite);
  const double local_compute_s = Seconds(step_start) - data_s;  // forward, backward, optimizer
  dlrun::worker::heartbeat();
  std::vector<torch::Tensor> l{torch::stack(
      {loss, torch::tensor(g_checkpoint_requested ? 1.0f : 0.0f, torch::TensorOptions().device(device_))})};
  if (world_ > 1) ctx_.pg->allreduce(l)->wait();
  const double mean_loss = l[0][0].item<double>() / world_;
  // The step record for dlrun's telemetry (docs/TELEMETRY.md); it is also the heartbeat.
  dlrun::worker::StepReport report;
  report.step = step;
  report.samples = a_.local_batch_size * a_.accumulation_steps;
  report.step_s = Seconds(step_start);
  report.data_s = data_s;
  if (a_.grad_sync && world_ > 1) {
    const auto timing = ddp_->lastStepTiming();
    report.sync_s = timing.sync_s;
    // DDP times the last micro-step's compute only: with accumulation the step's compute is
    // what the data wait and the sync wait leave.
    report.compute_s = a_.accumulation_steps > 1
                           ? std::max(0.0, report.step_s - data_s - timing.sync_s)
                           : timing.compute_s;
  } else {
    report.compute_s = local_compute_s;  // no gradient sync: the whole step's own work
    report.sync_s = 0;
  }
  report.loss = mean_loss;
  step_range.reset();
  dlrun::worker::reportStep(report);
  AfterStep(step, mean_loss, l[0][1].item<float>() > 0);
}

// Checkpoints (every N steps, or when a rank got SIGUSR1), the requeue after a preemption
// signal, and the step's report.
void Trainer::AfterStep(int64_t step, double mean_loss, bool signalled) {
  if (signalled || (a_.checkpoint_every > 0 && step % a_.checkpoint_every == 0)) {
    g_checkpoint_requested = false;
    Save(step);
  }
  if (signalled && rank_ == 0 && dlrun::worker::requeueOnSignalRequested()) {
    // Preemption (dlrun slurm --preemptible): the checkpoint is on disk, hand the job back to
    // Slurm; the requeued run resumes from it. Slurm then stops this run at once, so the line
    // comes first: printed after the requeue it may never reach the job's output.
    std::printf("requeueing Slurm job %s after the checkpoint at step %ld\n",
                std::getenv("SLURM_JOB_ID"), step);
    std::fflush(stdout);
    const std::string err = dlrun::worker::requeueSlurmJob();
    if (!err.empty()) std::fprintf(stderr, "train_unet: %s\n", err.c_str());
  }
  if (step == start_step_ + 1) first_loss_ = mean_loss;
  last_loss_ = mean_loss;
  epoch_loss_ += mean_loss;
  ++epoch_steps_;
  const double el = Seconds(t0_);
  if (tb_) {
    tb_->Scalar("train/loss", static_cast<float>(mean_loss), step);
    tb_->Scalar("train/lr", static_cast<float>(lr_), step);
    tb_->Scalar("train/samples_per_sec",
                static_cast<float>((step - start_step_) * global_batch_ / el), step);
  }
  if (rank_ == 0) {
    std::printf("step %ld/%ld  loss %.5f  lr %.3g  %.2f samples/s (all ranks, since start)\n",
                step, a_.max_steps, mean_loss, lr_, (step - start_step_) * global_batch_ / el);
    std::fflush(stdout);
  }
}

// The tutorial's per-epoch report, with validation.
void Trainer::EndOfEpoch(int64_t step) {
  const double secs = Seconds(epoch_start_);
  const int64_t epoch = (step - 1) / steps_per_epoch_ + 1;
  const auto val_start = Clock::now();
  const double val_loss = val_steps_ > 0 ? Validate() : 0;
  const double val_secs = Seconds(val_start);
  // --target-loss: the first time the validation loss (the epoch's training loss when there is
  // no validation) is at or below it. Every rank sees the same all-reduced figures.
  const double judged = val_steps_ > 0 ? val_loss : epoch_loss_ / std::max<int64_t>(1, epoch_steps_);
  if (a_.target_loss > 0 && target_step_ < 0 && judged <= a_.target_loss) {
    target_step_ = step;
    target_s_ = Seconds(t0_);
    target_of_ = val_steps_ > 0 ? "validation" : "training";
    if (rank_ == 0) {
      std::printf("target loss %g reached at step %ld after %.3f s (%s loss %.6f)\n",
                  a_.target_loss, step, target_s_, target_of_.c_str(), judged);
    }
  }
  if (tb_) {
    if (val_steps_ > 0) tb_->Scalar("val/loss", static_cast<float>(val_loss), step);
    tb_->Flush();
  }
  if (rank_ == 0) {
    std::printf("Time taken for epoch %ld is %.3f sec, avg %.3f samples/sec\n", epoch, secs,
                epoch_steps_ * global_batch_ / secs);
    std::printf("  Avg train loss=%.6f\n", epoch_loss_ / std::max<int64_t>(1, epoch_steps_));
    if (val_steps_ > 0) {
      std::printf("  Avg val loss=%.6f\n  Total validation time: %.3f sec\n", val_loss, val_secs);
    }
    std::fflush(stdout);
  }
  epoch_loss_ = 0;
  epoch_steps_ = 0;
  epoch_start_ = Clock::now();
}

// The last checkpoint, the summary, and every rank's parameter digest (so scripts can check
// the ranks agree bit for bit).
int Trainer::Finish() {
  if (start_step_ < a_.max_steps &&
      !(a_.checkpoint_every > 0 && a_.max_steps % a_.checkpoint_every == 0)) {
    Save(a_.max_steps);
  }
  const int64_t timed_steps = std::max<int64_t>(1, a_.max_steps - start_step_ - a_.warmup_steps);
  const double secs = Seconds(start_);
  const double sps = timed_steps * global_batch_ / secs;
  const uint64_t final_digest = dlrun::worker::digest(params_);
  double grad_sq = 0;
  for (const torch::Tensor& p : params_) {
    if (p.grad().defined()) grad_sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  const double grad_norm = std::sqrt(grad_sq);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  std::vector<torch::Tensor> mine{torch::tensor({static_cast<int64_t>(final_digest)}, long_opts)};
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < world_; ++r) all[0].push_back(torch::zeros({1}, long_opts));
  ctx_.pg->allgather(all, mine)->wait();
  if (rank_ != 0) return 0;
  std::printf("Time taken for %ld steps is %.3f sec, avg %.3f samples/sec\n", timed_steps, secs,
              sps);
  std::printf("final loss %.5f (first step %.5f), %.3f samples/s over %d rank(s)\n", last_loss_,
              first_loss_, sps, world_);
  if (a_.metrics_json.empty()) return 0;
  nlohmann::json j;
  j["world_size"] = world_;
  j["steps"] = a_.max_steps;
  j["local_batch_size"] = a_.local_batch_size;
  j["accumulation_steps"] = a_.accumulation_steps;
  j["global_batch_size"] = global_batch_;  // effective: ranks x local batch x micro-batches
  j["checkpoint_activations"] = a_.checkpoint_activations;
  j["peak_rss_bytes"] = PeakRssBytes();
  const int64_t peak_device = dlrun::examples::PeakDeviceMemoryBytes(device_);
  j["peak_device_memory_bytes"] = peak_device >= 0 ? nlohmann::json(peak_device) : nlohmann::json();
  // The most tensor memory allocated at once during the steps: max_memory_allocated on CUDA,
  // LibTorch's CPU allocation reports on the CPU.
  j["peak_allocated_bytes"] = peak_device >= 0 ? nlohmann::json(peak_device)
                              : cpu_peak_     ? nlohmann::json(cpu_peak_->peakBytes())
                                              : nlohmann::json();
  j["grad_norm"] = grad_norm;  // the last step's averaged gradient
  j["loader_threads"] = loader_threads_;
  j["intra_op_threads"] = intra_threads_;
  if (a_.target_loss > 0) {
    j["target_loss"] = a_.target_loss;
    j["target_loss_step"] = target_step_ >= 0 ? nlohmann::json(target_step_) : nlohmann::json();
    j["target_loss_s"] = target_step_ >= 0 ? nlohmann::json(target_s_) : nlohmann::json();
    j["target_loss_of"] = target_step_ >= 0 ? nlohmann::json(target_of_) : nlohmann::json();
  }
  j["samples_per_sec"] = sps;
  j["start_step"] = start_step_;
  j["final_lr"] = lr_;
  j["final_loss"] = last_loss_;
  j["first_loss"] = first_loss_;
  j["parameters"] = nparams_;
  j["initial_param_digest"] = std::to_string(initial_digest_);
  j["param_digests"] = nlohmann::json::array();
  for (const auto& t : all[0]) {
    j["param_digests"].push_back(std::to_string(static_cast<uint64_t>(t.item<int64_t>())));
  }
  std::ofstream out(a_.metrics_json);
  out << j.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "train_unet: cannot write --metrics-json %s\n", a_.metrics_json.c_str());
    return 1;
  }
  return 0;
}

int Trainer::Run() {
  ResolveSizes();
  SetThreads();
  BuildModel();
  BuildSchedule();
  Resume();
  OpenData();
  PrintHeader();
  if (a_.benchy) return Benchy();
  t0_ = start_ = epoch_start_ = Clock::now();
  if (!device_.is_cuda() && a_.measure_allocations) {
    cpu_peak_ = std::make_unique<dlrun::examples::CpuAllocationPeak>();
  }
  for (int64_t step = start_step_ + 1; step <= a_.max_steps; ++step) {
    if (step == start_step_ + a_.warmup_steps + 1) start_ = Clock::now();
    Step(step);
    if (step % steps_per_epoch_ == 0 || step == a_.max_steps) EndOfEpoch(step);
  }
  return Finish();
}

}  // namespace

namespace dlrun::examples {

int TrainUnetMain(int argc, char** argv) {
  TrainArgs a;
  if (const int rc = ParseTrainArgs(argc, argv, &a); rc >= 0) return rc;
  try {
    return Trainer(a).Run();
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    dlrun::worker::recordError("train_unet: " + what);
    std::fprintf(stderr, "train_unet: %s\n", what.c_str());
    return 1;
  }
}

}  // namespace dlrun::examples
