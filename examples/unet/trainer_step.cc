// train_unet's step loop: micro-steps and the optimizer step, benchy's trials,
// validation, checkpoints and the per-epoch report.
#include "unet/trainer_impl.h"

#include <cstdio>

namespace train_unet_internal {

double Steps::Validate() {
  const dlrun::worker::HangPause pause("eval");  // not a step: hang detection waits
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t i = 0; i < s_.sizes.val_steps; ++i) {
    auto [x, y] = s_.data.NextValidation();
    dlrun::examples::AutocastScope autocast(s_.scaler->enabled());
    sum += Loss(s_.model->forward(x), y, s_.a.lambda_rho).item<double>();
  }
  std::vector<torch::Tensor> t{torch::tensor({sum / std::max<int64_t>(1, s_.sizes.val_steps)},
                                             torch::TensorOptions().device(s_.device))};
  if (s_.world > 1) s_.ctx.all_reduce(t[0]);
  return t[0].item<double>() / s_.world;
}

void Steps::SaveIfLost(int64_t step) {
  if (!s_.ckpt || s_.rank != 0 || s_.a.checkpoint_every <= 0 || step <= 0 ||
      step % s_.a.checkpoint_every != 0) {
    return;
  }
  if (s_.ckpt->holds(step)) return;
  std::printf("checkpoint of step %ld missing (its writer was lost after the step): saving it\n",
              step);
  Save(step);
}

void Steps::Save(int64_t step) {
  if (!s_.ckpt || s_.rank != 0) return;
  if (step == s_.a.fail_at_step && s_.a.fail_how == "kill-before-save" &&
      s_.ctx.env.restart_count == 0 && std::getenv(dlrun::contract::kRecoveryGen) == nullptr) {
    std::fprintf(stderr, "train_unet: --fail-at-step %ld: SIGKILL before the save as asked\n", step);
    std::fflush(stderr);
    raise(SIGKILL);
  }
  const dlrun::worker::HangPause pause("checkpoint");
  try {
    s_.ckpt->save(*s_.model, *s_.opt, s_.rec->checkpoint_state(step));
    std::printf("checkpoint saved at step %ld\n", step);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "train_unet: checkpoint failed: %s\n", e.what());
  }
}

// benchy's step: forward, backward through DDP, optimiser step.
void Steps::TrainStep(const torch::Tensor& x, const torch::Tensor& y) {
  s_.opt->zero_grad(/*set_to_none=*/true);
  torch::Tensor loss;
  {
    dlrun::examples::AutocastScope autocast(s_.scaler->enabled());
    loss = Loss(s_.ddp()(x), y, s_.a.lambda_rho);
  }
  s_.scaler->scale(loss).backward();
  const bool finite = s_.scaler->unscale(s_.params);
  if (finite) s_.opt->step();
  s_.scaler->update(finite);
}

// benchy's three trials: the loader alone (IO), the model on one cached batch (SYNTHETIC), and
// normal training (FULL); FULL is bounded by the slower of the first two.
int Steps::Benchy() {
  // Each mode: --benchy-trials trials of --max-steps steps (samples/s of all ranks), reported
  // as benchy does: the mean +/- the standard deviation over the trials.
  const int64_t batch = s_.a.local_batch_size * s_.world;
  struct Trial {
    double mean = 0, spread = 0;
  };
  auto trial = [&](const char* mode, const std::function<void()>& step) {
    step();  // warm-up
    std::vector<double> rates;
    for (int k = 0; k < s_.a.benchy_trials; ++k) {
      if (s_.world > 1) s_.ctx.pg->barrier()->wait();
      const auto t = Clock::now();
      for (int64_t i = 0; i < s_.a.max_steps; ++i) step();
      if (s_.world > 1) s_.ctx.pg->barrier()->wait();
      rates.push_back(static_cast<double>(s_.a.max_steps * batch) / Seconds(t));
      if (s_.rank == 0)
        std::printf("BENCHY::%s trial %d: %.3f samples/s\n", mode, k + 1, rates.back());
    }
    Trial r;
    for (double v : rates) r.mean += v / static_cast<double>(rates.size());
    for (double v : rates) r.spread += (v - r.mean) * (v - r.mean) / static_cast<double>(rates.size());
    r.spread = std::sqrt(r.spread);
    return r;
  };
  const Trial io_t = trial("IO", [&] { s_.data.Next(); });
  auto cached = s_.data.Next();
  const Trial synth_t = trial("SYNTHETIC", [&] { TrainStep(cached.first, cached.second); });
  const Trial full_t = trial("FULL", [&] {
    auto b = s_.data.Next();
    TrainStep(b.first, b.second);
  });
  const double io = io_t.mean, synth = synth_t.mean;
  if (s_.rank == 0) {
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
torch::Tensor Steps::MicroStep(int64_t step, bool sync, double* data_s) {
  const auto wait_start = Clock::now();
  auto [x, y] = [&] {
    dlrun::worker::ScopedRange r("data wait");
    return s_.data.Take();
  }();
  *data_s += Seconds(wait_start);
  std::optional<dlrun::worker::DistributedDataParallelBase::NoSyncGuard> local_only;
  if (!sync) local_only.emplace(&s_.ddp());
  torch::Tensor loss;
  {
    dlrun::worker::ScopedRange r("forward");
    dlrun::examples::AutocastScope autocast(s_.scaler->enabled());
    // Without gradient sync at all (benchmarks): the model itself, gradients stay local.
    loss = Loss(s_.a.grad_sync ? s_.ddp()(x) : s_.model->forward(x), y, s_.a.lambda_rho);
  }
  // --inject-inf-step: an overflow on purpose (every gradient becomes inf or NaN).
  if (step == s_.a.inject_inf_step) loss = loss * std::numeric_limits<float>::infinity();
  dlrun::worker::ScopedRange r("backward");
  const double k = static_cast<double>(s_.a.accumulation_steps);
  s_.scaler->scale(k > 1 ? loss / k : loss).backward();  // with sync: averaged over ranks on return
  // CUDA: the next batch's host-to-device copy goes on its side stream now, while this step's
  // kernels run (no effect on the CPU, where the copy is the batch itself).
  if (s_.device.is_cuda() && (step < s_.a.max_steps || !sync)) s_.data.Prefetch();
  return loss.detach();
}

// One training step: K micro-steps, the optimizer step. The loss is averaged over ranks, and
// the same allreduce tells every rank whether any rank was asked to checkpoint (SIGUSR1), so
// every rank decides alike.
void Steps::Step(int64_t step) {
  // Once: not after a restart, and not in the process that replaced it (in-process recovery).
  if (step == s_.a.fail_at_step && s_.ctx.env.restart_count == 0 && s_.rank == s_.world - 1 &&
      s_.a.fail_how != "kill-before-save" &&
      std::getenv(dlrun::contract::kRecoveryGen) == nullptr) {
    std::fprintf(stderr, "train_unet: --fail-at-step %ld: %s as asked\n", step,
                 s_.a.fail_how == "kill"   ? "SIGKILL"
                 : s_.a.fail_how == "stop" ? "SIGSTOP"
                                           : "exiting");
    std::fflush(stderr);
    if (s_.a.fail_how == "kill") raise(SIGKILL);
    if (s_.a.fail_how == "stop") raise(SIGSTOP);  // the peers wait for it in the step's collective
    std::exit(1);
  }
  const auto step_start = Clock::now();
  // NVTX ranges for nsys (dlrun/nvtx_ranges.h): the step, and its data wait, forward, backward (the
  // buckets' all-reduce ranges start inside it) and optimizer step; the checkpoint after it.
  std::optional<dlrun::worker::ScopedRange> step_range(std::in_place, "step", step);
  s_.progress.lr = dlrun::worker::learning_rate(s_.sched, step - 1);
  dlrun::worker::set_learning_rate(*s_.opt, s_.progress.lr);
  s_.opt->zero_grad(/*set_to_none=*/true);  // the DGX guide's: no memset, fresh gradients
  double data_s = 0;
  torch::Tensor loss_sum;
  for (int64_t m = 0; m < s_.a.accumulation_steps; ++m) {
    const bool last = m + 1 == s_.a.accumulation_steps;
    torch::Tensor l = MicroStep(step, s_.a.grad_sync && last, &data_s);
    loss_sum = m == 0 ? l.to(torch::kFloat32) : loss_sum + l.to(torch::kFloat32);
  }
  const torch::Tensor loss = loss_sum / static_cast<double>(s_.a.accumulation_steps);
  const double local_compute_s = Seconds(step_start) - data_s;  // forward, backward
  dlrun::worker::heartbeat();
  // The step's last collective comes before the optimizer update, so a peer lost in it leaves
  // every survivor's state at the step before (in-process recovery redoes this one).
  std::vector<torch::Tensor> l{
      torch::stack({loss, torch::tensor(g_checkpoint_requested ? 1.0f : 0.0f,
                                        torch::TensorOptions().device(s_.device))})};
  if (s_.world > 1) s_.ctx.all_reduce(l[0]);
  // The update ends the step (nothing after it changes the state: committed there, nothing
  // copied). NCCL runs the step's sums behind the CPU: the update waits for them before the
  // scaler reads the gradients, and gives the step up when a peer was lost meanwhile (a partial
  // sum is never applied). An overflow under AMP skips the update on every rank alike.
  bool finite = true;
  s_.rec->update({.apply =
                      [&] {
                        dlrun::worker::ScopedRange opt_range("optimizer step");
                        finite = s_.scaler->unscale(s_.params);
                        if (finite) s_.opt->step();
                        s_.scaler->update(finite);
                      },
                  .ends_step = true});
  if (!finite && s_.rank == 0) {
    std::printf("step %ld: non-finite gradients, step skipped%s\n", step,
                s_.scaler->enabled() ? " by the loss scaler" : "");
  }
  const double mean_loss = l[0][0].item<double>() / s_.world;
  // The step record for dlrun's telemetry (docs/TELEMETRY.md); it is also the heartbeat.
  dlrun::worker::StepReport report;
  report.step = step;
  report.samples = s_.a.local_batch_size * s_.a.accumulation_steps;
  report.step_s = Seconds(step_start);
  report.data_s = data_s;
  if (s_.a.grad_sync && s_.world > 1) {
    const auto timing = s_.ddp().last_step_timing();
    report.sync_s = timing.sync_s;
    // DDP times the last micro-step's compute only: with accumulation the step's compute is
    // what the data wait and the sync wait leave.
    report.compute_s = s_.a.accumulation_steps > 1
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
void Steps::AfterStep(int64_t step, double mean_loss, bool signalled) {
  if (signalled || (s_.a.checkpoint_every > 0 && step % s_.a.checkpoint_every == 0)) {
    g_checkpoint_requested = false;
    Save(step);
  }
  if (signalled && s_.rank == 0 && dlrun::worker::requeue_on_signal_requested()) {
    // Preemption (dlrun slurm --preemptible): the checkpoint is on disk, hand the job back to
    // Slurm; the requeued run resumes from it. Slurm then stops this run at once, so the line
    // comes first: printed after the requeue it may never reach the job's output.
    std::printf("requeueing Slurm job %s after the checkpoint at step %ld\n",
                std::getenv("SLURM_JOB_ID"), step);
    std::fflush(stdout);
    const std::string err = dlrun::worker::requeue_slurm_job();
    if (!err.empty()) std::fprintf(stderr, "train_unet: %s\n", err.c_str());
  }
  if (step == s_.start_step + 1) s_.progress.first_loss = mean_loss;
  s_.progress.last_loss = mean_loss;
  s_.progress.epoch_loss += mean_loss;
  ++s_.progress.epoch_steps;
  const double el = Seconds(s_.progress.t0);
  if (s_.tb) {
    s_.tb->Scalar("train/loss", static_cast<float>(mean_loss), step);
    s_.tb->Scalar("train/lr", static_cast<float>(s_.progress.lr), step);
    s_.tb->Scalar("train/samples_per_sec",
                  static_cast<float>((step - s_.start_step) * s_.sizes.global_batch / el), step);
  }
  if (s_.rank == 0) {
    std::printf("step %ld/%ld  loss %.5f  lr %.3g  %.2f samples/s (all ranks, since start)\n", step,
                s_.a.max_steps, mean_loss, s_.progress.lr,
                (step - s_.start_step) * s_.sizes.global_batch / el);
    std::fflush(stdout);
  }
}

// The tutorial's per-epoch report, with validation.
void Steps::EndOfEpoch(int64_t step) {
  const double secs = Seconds(s_.progress.epoch_start);
  const int64_t epoch = (step - 1) / s_.sizes.steps_per_epoch + 1;
  const auto val_start = Clock::now();
  const double val_loss = s_.sizes.val_steps > 0 ? Validate() : 0;
  const double val_secs = Seconds(val_start);
  // --target-loss: the first time the validation loss (the epoch's training loss when there is
  // no validation) is at or below it. Every rank sees the same all-reduced figures.
  const double judged = s_.sizes.val_steps > 0 ? val_loss
                                               : s_.progress.epoch_loss /
                                                     std::max<int64_t>(1, s_.progress.epoch_steps);
  if (s_.a.target_loss > 0 && s_.progress.target_step < 0 && judged <= s_.a.target_loss) {
    s_.progress.target_step = step;
    s_.progress.target_s = Seconds(s_.progress.t0);
    s_.progress.target_of = s_.sizes.val_steps > 0 ? "validation" : "training";
    if (s_.rank == 0) {
      std::printf("target loss %g reached at step %ld after %.3f s (%s loss %.6f)\n",
                  s_.a.target_loss, step, s_.progress.target_s, s_.progress.target_of.c_str(),
                  judged);
    }
  }
  if (s_.tb) {
    if (s_.sizes.val_steps > 0) s_.tb->Scalar("val/loss", static_cast<float>(val_loss), step);
    s_.tb->Flush();
  }
  if (s_.rank == 0) {
    std::printf("Time taken for epoch %ld is %.3f sec, avg %.3f samples/sec\n", epoch, secs,
                s_.progress.epoch_steps * s_.sizes.global_batch / secs);
    std::printf("  Avg train loss=%.6f\n",
                s_.progress.epoch_loss / std::max<int64_t>(1, s_.progress.epoch_steps));
    if (s_.sizes.val_steps > 0) {
      std::printf("  Avg val loss=%.6f\n  Total validation time: %.3f sec\n", val_loss, val_secs);
    }
    std::fflush(stdout);
  }
  s_.progress.epoch_loss = 0;
  s_.progress.epoch_steps = 0;
  s_.progress.epoch_start = Clock::now();
}

}  // namespace train_unet_internal
