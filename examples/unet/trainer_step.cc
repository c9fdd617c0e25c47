// train_unet's step loop: micro-steps and the optimizer step, benchy's trials,
// validation, checkpoints and the per-epoch report.
#include "unet/trainer_impl.h"

#include <cstdio>

namespace train_unet_internal {

double Trainer::Validate() {
  const dlrun::worker::HangPause pause("eval");  // not a step: hang detection waits
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t i = 0; i < sizes_.val_steps; ++i) {
    auto [x, y] = data_.NextValidation();
    dlrun::examples::AutocastScope autocast(scaler_->enabled());
    sum += Loss(model_->forward(x), y, a_.lambda_rho).item<double>();
  }
  std::vector<torch::Tensor> t{torch::tensor({sum / std::max<int64_t>(1, sizes_.val_steps)},
                                             torch::TensorOptions().device(device_))};
  if (world_ > 1) ctx_.all_reduce(t[0]);
  return t[0].item<double>() / world_;
}

void Trainer::SaveIfLost(int64_t step) {
  if (!ckpt_ || rank_ != 0 || a_.checkpoint_every <= 0 || step <= 0 ||
      step % a_.checkpoint_every != 0) {
    return;
  }
  if (ckpt_->holds(step)) return;
  std::printf("checkpoint of step %ld missing (its writer was lost after the step): saving it\n",
              step);
  Save(step);
}

void Trainer::Save(int64_t step) {
  if (!ckpt_ || rank_ != 0) return;
  if (step == a_.fail_at_step && a_.fail_how == "kill-before-save" &&
      ctx_.env.restart_count == 0 && std::getenv(dlrun::contract::kRecoveryGen) == nullptr) {
    std::fprintf(stderr, "train_unet: --fail-at-step %ld: SIGKILL before the save as asked\n", step);
    std::fflush(stderr);
    raise(SIGKILL);
  }
  const dlrun::worker::HangPause pause("checkpoint");
  try {
    ckpt_->save(*model_, *opt_, rec_->checkpoint_state(step));
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
    loss = Loss(Ddp()(x), y, a_.lambda_rho);
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
  const Trial io_t = trial("IO", [&] { data_.Next(); });
  auto cached = data_.Next();
  const Trial synth_t = trial("SYNTHETIC", [&] { TrainStep(cached.first, cached.second); });
  const Trial full_t = trial("FULL", [&] {
    auto b = data_.Next();
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
    return data_.Take();
  }();
  *data_s += Seconds(wait_start);
  std::optional<dlrun::worker::DistributedDataParallelBase::NoSyncGuard> local_only;
  if (!sync) local_only.emplace(&Ddp());
  torch::Tensor loss;
  {
    dlrun::worker::ScopedRange r("forward");
    dlrun::examples::AutocastScope autocast(scaler_->enabled());
    // Without gradient sync at all (benchmarks): the model itself, gradients stay local.
    loss = Loss(a_.grad_sync ? Ddp()(x) : model_->forward(x), y, a_.lambda_rho);
  }
  // --inject-inf-step: an overflow on purpose (every gradient becomes inf or NaN).
  if (step == a_.inject_inf_step) loss = loss * std::numeric_limits<float>::infinity();
  dlrun::worker::ScopedRange r("backward");
  const double k = static_cast<double>(a_.accumulation_steps);
  scaler_->scale(k > 1 ? loss / k : loss).backward();  // with sync: averaged over ranks on return
  // CUDA: the next batch's host-to-device copy goes on its side stream now, while this step's
  // kernels run (no effect on the CPU, where the copy is the batch itself).
  if (device_.is_cuda() && (step < a_.max_steps || !sync)) data_.Prefetch();
  return loss.detach();
}

// One training step: K micro-steps, the optimizer step. The loss is averaged over ranks, and
// the same allreduce tells every rank whether any rank was asked to checkpoint (SIGUSR1), so
// every rank decides alike.
void Trainer::Step(int64_t step) {
  // Once: not after a restart, and not in the process that replaced it (in-process recovery).
  if (step == a_.fail_at_step && ctx_.env.restart_count == 0 && rank_ == world_ - 1 &&
      a_.fail_how != "kill-before-save" && std::getenv(dlrun::contract::kRecoveryGen) == nullptr) {
    std::fprintf(stderr, "train_unet: --fail-at-step %ld: %s as asked\n", step,
                 a_.fail_how == "kill"   ? "SIGKILL"
                 : a_.fail_how == "stop" ? "SIGSTOP"
                                         : "exiting");
    std::fflush(stderr);
    if (a_.fail_how == "kill") raise(SIGKILL);
    if (a_.fail_how == "stop") raise(SIGSTOP);  // the peers wait for it in the step's collective
    std::exit(1);
  }
  const auto step_start = Clock::now();
  // NVTX ranges for nsys (dlrun/nvtx_ranges.h): the step, and its data wait, forward, backward (the
  // buckets' all-reduce ranges start inside it) and optimizer step; the checkpoint after it.
  std::optional<dlrun::worker::ScopedRange> step_range(std::in_place, "step", step);
  progress_.lr = dlrun::worker::learning_rate(sched_, step - 1);
  dlrun::worker::set_learning_rate(*opt_, progress_.lr);
  opt_->zero_grad(/*set_to_none=*/true);  // the DGX guide's: no memset, fresh gradients
  double data_s = 0;
  torch::Tensor loss_sum;
  for (int64_t m = 0; m < a_.accumulation_steps; ++m) {
    const bool last = m + 1 == a_.accumulation_steps;
    torch::Tensor l = MicroStep(step, a_.grad_sync && last, &data_s);
    loss_sum = m == 0 ? l.to(torch::kFloat32) : loss_sum + l.to(torch::kFloat32);
  }
  const torch::Tensor loss = loss_sum / static_cast<double>(a_.accumulation_steps);
  const double local_compute_s = Seconds(step_start) - data_s;  // forward, backward
  dlrun::worker::heartbeat();
  // The step's last collective comes before the optimizer update, so a peer lost in it leaves
  // every survivor's state at the step before (in-process recovery redoes this one).
  std::vector<torch::Tensor> l{torch::stack(
      {loss, torch::tensor(g_checkpoint_requested ? 1.0f : 0.0f, torch::TensorOptions().device(device_))})};
  if (world_ > 1) ctx_.all_reduce(l[0]);
  // The update ends the step (nothing after it changes the state: committed there, nothing
  // copied). NCCL runs the step's sums behind the CPU: the update waits for them before the
  // scaler reads the gradients, and gives the step up when a peer was lost meanwhile (a partial
  // sum is never applied). An overflow under AMP skips the update on every rank alike.
  bool finite = true;
  rec_->update({.apply =
                    [&] {
                      dlrun::worker::ScopedRange opt_range("optimizer step");
                      finite = scaler_->unscale(params_);
                      if (finite) opt_->step();
                      scaler_->update(finite);
                    },
                .ends_step = true});
  if (!finite && rank_ == 0) {
    std::printf("step %ld: non-finite gradients, step skipped%s\n", step,
                scaler_->enabled() ? " by the loss scaler" : "");
  }
  const double mean_loss = l[0][0].item<double>() / world_;
  // The step record for dlrun's telemetry (docs/TELEMETRY.md); it is also the heartbeat.
  dlrun::worker::StepReport report;
  report.step = step;
  report.samples = a_.local_batch_size * a_.accumulation_steps;
  report.step_s = Seconds(step_start);
  report.data_s = data_s;
  if (a_.grad_sync && world_ > 1) {
    const auto timing = Ddp().last_step_timing();
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
  dlrun::worker::report_step(report);
  AfterStep(step, mean_loss, l[0][1].item<float>() > 0);
}

// Checkpoints (every N steps, or when a rank got SIGUSR1), the requeue after a preemption
// signal, and the step's report.
void Trainer::AfterStep(int64_t step, double mean_loss, bool signalled) {
  if (signalled || (a_.checkpoint_every > 0 && step % a_.checkpoint_every == 0)) {
    g_checkpoint_requested = false;
    Save(step);
  }
  if (signalled && rank_ == 0 && dlrun::worker::requeue_on_signal_requested()) {
    // Preemption (dlrun slurm --preemptible): the checkpoint is on disk, hand the job back to
    // Slurm; the requeued run resumes from it. Slurm then stops this run at once, so the line
    // comes first: printed after the requeue it may never reach the job's output.
    std::printf("requeueing Slurm job %s after the checkpoint at step %ld\n",
                std::getenv("SLURM_JOB_ID"), step);
    std::fflush(stdout);
    const std::string err = dlrun::worker::requeue_slurm_job();
    if (!err.empty()) std::fprintf(stderr, "train_unet: %s\n", err.c_str());
  }
  if (step == start_step_ + 1) progress_.first_loss = mean_loss;
  progress_.last_loss = mean_loss;
  progress_.epoch_loss += mean_loss;
  ++progress_.epoch_steps;
  const double el = Seconds(progress_.t0);
  if (tb_) {
    tb_->Scalar("train/loss", static_cast<float>(mean_loss), step);
    tb_->Scalar("train/lr", static_cast<float>(progress_.lr), step);
    tb_->Scalar("train/samples_per_sec",
                static_cast<float>((step - start_step_) * sizes_.global_batch / el), step);
  }
  if (rank_ == 0) {
    std::printf("step %ld/%ld  loss %.5f  lr %.3g  %.2f samples/s (all ranks, since start)\n", step,
                a_.max_steps, mean_loss, progress_.lr,
                (step - start_step_) * sizes_.global_batch / el);
    std::fflush(stdout);
  }
}

// The tutorial's per-epoch report, with validation.
void Trainer::EndOfEpoch(int64_t step) {
  const double secs = Seconds(progress_.epoch_start);
  const int64_t epoch = (step - 1) / sizes_.steps_per_epoch + 1;
  const auto val_start = Clock::now();
  const double val_loss = sizes_.val_steps > 0 ? Validate() : 0;
  const double val_secs = Seconds(val_start);
  // --target-loss: the first time the validation loss (the epoch's training loss when there is
  // no validation) is at or below it. Every rank sees the same all-reduced figures.
  const double judged = sizes_.val_steps > 0
                            ? val_loss
                            : progress_.epoch_loss / std::max<int64_t>(1, progress_.epoch_steps);
  if (a_.target_loss > 0 && progress_.target_step < 0 && judged <= a_.target_loss) {
    progress_.target_step = step;
    progress_.target_s = Seconds(progress_.t0);
    progress_.target_of = sizes_.val_steps > 0 ? "validation" : "training";
    if (rank_ == 0) {
      std::printf("target loss %g reached at step %ld after %.3f s (%s loss %.6f)\n",
                  a_.target_loss, step, progress_.target_s, progress_.target_of.c_str(), judged);
    }
  }
  if (tb_) {
    if (sizes_.val_steps > 0) tb_->Scalar("val/loss", static_cast<float>(val_loss), step);
    tb_->Flush();
  }
  if (rank_ == 0) {
    std::printf("Time taken for epoch %ld is %.3f sec, avg %.3f samples/sec\n", epoch, secs,
                progress_.epoch_steps * sizes_.global_batch / secs);
    std::printf("  Avg train loss=%.6f\n",
                progress_.epoch_loss / std::max<int64_t>(1, progress_.epoch_steps));
    if (sizes_.val_steps > 0) {
      std::printf("  Avg val loss=%.6f\n  Total validation time: %.3f sec\n", val_loss, val_secs);
    }
    std::fflush(stdout);
  }
  progress_.epoch_loss = 0;
  progress_.epoch_steps = 0;
  progress_.epoch_start = Clock::now();
}

}  // namespace train_unet_internal
