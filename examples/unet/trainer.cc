// The train_unet program: the SC22 tutorial's U-Net trainer on LibTorch + dlrun::worker.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <optional>
#include <cstdio>
#include <fstream>

#include "dlrun/agent_link.h"
#include "dlrun/checkpoint.h"
#include "dlrun/ddp.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/worker.h"
#include "nlohmann/json.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "unet/config.h"
#include "unet/data.h"
#include "unet/gpu.h"
#include "unet/tensorboard.h"
#include "unet/trainer.h"
#include "unet/unet.h"

namespace {

struct Args {
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
  int prefetch_factor = 2;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0: only at the end and on SIGUSR1
  std::string lr_scaling = "none";
  int64_t base_batch_size = 0;  // 0: the global batch (no scaling)
  int64_t lr_warmup_steps = 0;
  double end_lr = 0;
  int64_t fail_at_step = 0;  // fault injection for restart tests: exit 1 at this step once
  // From --config (the tutorial's epochs): 0 = not set.
  int64_t num_epochs = 0;
  int64_t nsamples = 0;      // training samples per epoch
  int64_t nsamples_val = 0;  // validation samples per epoch
  int64_t global_batch_size = 0;
  std::string val_path;
  bool max_steps_given = false, local_batch_given = false;
  double lambda_rho = 0;
  bool benchy = false;
  std::string tensorboard_dir;
  std::string device = "auto";  // auto | cpu | cuda
  bool amp = true;               // mixed precision, on CUDA only
  int channels_last = -1;        // -1: on CUDA only
};

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

int Train(Args a) {
  dlrun::worker::Context ctx = dlrun::worker::init();
  const int rank = ctx.rank();
  const int world = ctx.worldSize();
  if (a.global_batch_size > 0 && !a.local_batch_given) {
    if (a.global_batch_size % world != 0) {
      throw std::runtime_error(absl::StrCat("global_batch_size ", a.global_batch_size,
                                            " does not split over ", world,
                                            " ranks: expected a multiple of the world size"));
    }
    a.local_batch_size = a.global_batch_size / world;
  }
  if (a.num_epochs > 0 && !a.max_steps_given) {
    a.max_steps = a.num_epochs * std::max<int64_t>(1, a.nsamples / (a.local_batch_size * world));
  }
  if (a.warmup_steps >= a.max_steps) a.warmup_steps = 0;
  torch::manual_seed(a.seed);  // identical init everywhere; rank 0's values are broadcast anyway

  dlrun::examples::UNet model(dlrun::examples::UNetOptions{4, 5, a.base_channels});
  // The GPU path (never run here: no GPU): the rank's device, cuDNN/TF32, channels-last,
  // autocast with loss scaling. On the CPU only channels-last can be asked for.
  const torch::Device device = dlrun::examples::PickDevice(a.device, ctx.env.local_rank);
  dlrun::examples::ConfigureBackends(device);
  model->to(device);
  const bool channels_last = a.channels_last < 0 ? device.is_cuda() : a.channels_last > 0;
  if (channels_last) dlrun::examples::ToChannelsLast(model->parameters());
  dlrun::examples::GradScaler scaler(a.amp && device.is_cuda());
  auto to_device = [&](torch::Tensor t) {
    if (device.is_cuda()) t = t.pin_memory().to(device, /*non_blocking=*/true);
    return channels_last ? t.contiguous(torch::MemoryFormat::ChannelsLast3d) : t;
  };
  auto batch = [&](std::pair<torch::Tensor, torch::Tensor> b) {
    return std::make_pair(to_device(b.first), to_device(b.second));
  };
  std::vector<torch::Tensor> params = model->parameters();
  const uint64_t initial_digest = dlrun::worker::digest(params);
  int64_t nparams = 0;
  for (const auto& p : params) nparams += p.numel();

  torch::optim::Adam opt(params, torch::optim::AdamOptions(a.lr));

  dlrun::worker::LrSchedule sched;
  sched.start_lr = a.lr;
  sched.end_lr = a.end_lr;
  sched.tot_steps = a.max_steps;
  sched.warmup_steps = a.lr_warmup_steps;
  sched.global_batch_size = a.local_batch_size * world;
  sched.base_batch_size = a.base_batch_size > 0 ? a.base_batch_size : sched.global_batch_size;
  sched.scaling = a.lr_scaling;
  if (absl::Status s = dlrun::worker::Validate(sched); !s.ok()) {
    throw std::runtime_error(std::string(s.message()));
  }

  // Resume after an elastic restart or a requeue: every rank loads the newest valid
  // checkpoint (the directory must be shared between nodes).
  std::optional<dlrun::worker::CheckpointManager> ckpt;
  int64_t start_step = 0;
  if (!a.checkpoint_dir.empty()) {
    ckpt.emplace(dlrun::worker::CheckpointOptions{a.checkpoint_dir, 3, {}});
    auto resumed = ckpt->resumeLatest(*model, opt, [&](const std::string& w) {
      std::fprintf(stderr, "train_unet: warning: %s\n", w.c_str());
    });
    if (!resumed.ok()) throw std::runtime_error(std::string(resumed.status().message()));
    if (resumed->has_value()) {
      start_step = (*resumed)->step;
      if (rank == 0) std::printf("resumed from step %ld\n", start_step);
    }
  }
  // Wrap after loading, as with PyTorch: DDP then starts from rank 0's resumed parameters.
  dlrun::worker::DDPOptions ddp_opts;
  ddp_opts.bucket_cap_mb = a.bucket_cap_mb;
  ddp_opts.broadcast_buffers = a.broadcast_buffers;
  ddp_opts.fp16_compression = a.fp16_grad_compression;
  dlrun::worker::DistributedDataParallel ddp(model.ptr(), ctx.pg, ddp_opts);
  auto save = [&](int64_t step) {
    if (!ckpt || rank != 0) return;
    if (absl::Status s = ckpt->save(*model, opt, {step, 0, 0}); !s.ok()) {
      std::fprintf(stderr, "train_unet: checkpoint failed: %s\n", std::string(s.message()).c_str());
    } else {
      std::printf("checkpoint saved at step %ld\n", step);
    }
  };
  std::signal(SIGUSR1, OnSigusr1);

  std::unique_ptr<SyntheticData> synthetic, synthetic_val;
  std::unique_ptr<dlrun::examples::Prefetcher> loader, loader_val;
  auto open_loader = [&](const std::string& path, uint64_t seed) {
    auto src = dlrun::examples::CropSource::Open(path, a.data_size, a.data_mode == "inmem");
    if (!src.ok()) throw std::runtime_error(std::string(src.status().message()));
    return std::make_unique<dlrun::examples::Prefetcher>(
        std::shared_ptr<dlrun::examples::CropSource>(std::move(*src)), a.num_data_workers,
        a.prefetch_factor, seed);
  };
  if (a.data.empty()) {
    synthetic = std::make_unique<SyntheticData>(a.data_size, a.seed, rank);
    if (a.nsamples_val > 0) synthetic_val = std::make_unique<SyntheticData>(a.data_size, a.seed, 7777 + rank);
  } else {
    loader = open_loader(a.data, a.seed * 7919 + rank + 1 + start_step * 1000003);
    if (a.nsamples_val > 0) {
      loader_val = open_loader(a.val_path.empty() ? a.data : a.val_path, a.seed * 31 + rank + 1);
    }
  }
  // Epochs as in the tutorial: Nsamples per epoch over the global batch; without a config the
  // whole run is one epoch.
  const int64_t global_batch = a.local_batch_size * world;
  const int64_t steps_per_epoch =
      a.nsamples > 0 ? std::max<int64_t>(1, a.nsamples / global_batch) : a.max_steps;
  const int64_t val_steps = a.nsamples_val > 0 ? std::max<int64_t>(1, a.nsamples_val / global_batch) : 0;
  auto validate = [&]() {
    torch::NoGradGuard no_grad;
    double sum = 0;
    for (int64_t i = 0; i < val_steps; ++i) {
      auto [x, y] = batch(loader_val ? loader_val->Next(a.local_batch_size)
                                     : synthetic_val->Batch(a.local_batch_size));
      dlrun::examples::AutocastScope autocast(scaler.enabled());
      sum += Loss(model->forward(x), y, a.lambda_rho).item<double>();
    }
    std::vector<torch::Tensor> t{
        torch::tensor({sum / std::max<int64_t>(1, val_steps)}, torch::TensorOptions().device(device))};
    if (world > 1) ctx.pg->allreduce(t)->wait();
    return t[0].item<double>() / world;
  };
  if (rank == 0) {
    std::printf("train_unet: %d rank(s), base width %ld (%.2f M parameters), %ld^3 crops, "
                "local batch %ld, %d thread(s) per rank, gradient sync %s, device %s%s%s\n",
                world, a.base_channels, nparams / 1e6, a.data_size, a.local_batch_size,
                torch::get_num_threads(), a.grad_sync ? "on" : "off", device.str().c_str(),
                scaler.enabled() ? ", AMP" : "", channels_last ? ", channels-last" : "");
    std::printf("%s\n", ddp.bucketReport().c_str());
    std::fflush(stdout);
  }

  std::unique_ptr<dlrun::examples::EventWriter> tb;
  if (!a.tensorboard_dir.empty() && rank == 0) {
    auto w = dlrun::examples::EventWriter::Open(a.tensorboard_dir);
    if (!w.ok()) throw std::runtime_error(std::string(w.status().message()));
    tb = std::move(*w);
  }
  using Clock = std::chrono::steady_clock;
  if (a.benchy) {
    // benchy's three trials: the loader alone (IO), the model on one cached batch (SYNTHETIC),
    // and normal training (FULL); FULL is bounded by the slower of the first two.
    auto next = [&] {
      return batch(loader ? loader->Next(a.local_batch_size) : synthetic->Batch(a.local_batch_size));
    };
    auto train_step = [&](const torch::Tensor& x, const torch::Tensor& y) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        dlrun::examples::AutocastScope autocast(scaler.enabled());
        loss = Loss(ddp.forward<torch::Tensor>(model, x), y, a.lambda_rho);
      }
      scaler.scale(loss).backward();
      const bool finite = scaler.unscale(params);
      if (finite) opt.step();
      scaler.update(finite);
    };
    auto trial = [&](const std::function<void()>& step) {
      step();  // warm-up
      if (world > 1) ctx.pg->barrier()->wait();
      const auto t = Clock::now();
      for (int64_t i = 0; i < a.max_steps; ++i) step();
      if (world > 1) ctx.pg->barrier()->wait();
      return a.max_steps * global_batch / std::chrono::duration<double>(Clock::now() - t).count();
    };
    const double io = trial([&] { next(); });
    auto cached = next();
    const double synth = trial([&] { train_step(cached.first, cached.second); });
    const double full = trial([&] {
      auto b = next();
      train_step(b.first, b.second);
    });
    if (rank == 0) {
      std::printf("BENCHY::SUMMARY::IO average trial throughput: %.3f\n", io);
      std::printf("BENCHY::SUMMARY:: SYNTHETIC average trial throughput: %.3f\n", synth);
      std::printf("BENCHY::SUMMARY::FULL average trial throughput: %.3f\n", full);
      std::printf("FULL is bounded by %s: %s (%.3f) is slower than %s (%.3f) samples/s\n",
                  io < synth ? "data loading" : "compute", io < synth ? "IO" : "SYNTHETIC",
                  std::min(io, synth), io < synth ? "SYNTHETIC" : "IO", std::max(io, synth));
    }
    return 0;
  }
  Clock::time_point t0 = Clock::now(), start = t0;
  double first_loss = 0, last_loss = 0, lr = a.lr, epoch_loss = 0;
  int64_t epoch_steps = 0;
  Clock::time_point epoch_start = Clock::now();
  for (int64_t step = start_step + 1; step <= a.max_steps; ++step) {
    if (step == start_step + a.warmup_steps + 1) start = Clock::now();
    if (step == a.fail_at_step && ctx.env.restart_count == 0 && rank == world - 1) {
      std::fprintf(stderr, "train_unet: --fail-at-step %ld: exiting as asked\n", step);
      std::exit(1);
    }
    auto [x, y] =
        batch(loader ? loader->Next(a.local_batch_size) : synthetic->Batch(a.local_batch_size));
    lr = dlrun::worker::LearningRate(sched, step - 1);
    dlrun::worker::SetLearningRate(opt, lr);
    opt.zero_grad();
    torch::Tensor loss;
    {
      // Without sync (benchmarks): the same step, gradients stay local.
      std::optional<dlrun::worker::DistributedDataParallel::NoSyncGuard> local_only;
      if (!a.grad_sync) local_only.emplace(&ddp);
      {
        dlrun::examples::AutocastScope autocast(scaler.enabled());
        loss = Loss(a.grad_sync ? ddp.forward<torch::Tensor>(model, x) : model->forward(x), y,
                    a.lambda_rho);
      }
      scaler.scale(loss).backward();  // with sync: averaged over ranks when this returns
    }
    const bool finite = scaler.unscale(params);
    if (finite) opt.step();  // an overflow under AMP skips the step on every rank alike
    scaler.update(finite);
    dlrun::worker::heartbeat();

    // The loss averaged over ranks, and whether any rank was asked to checkpoint (one
    // allreduce for both, so every rank takes the same decision).
    std::vector<torch::Tensor> l{torch::stack(
        {loss.detach().to(torch::kFloat32),
         torch::tensor(g_checkpoint_requested ? 1.0f : 0.0f, torch::TensorOptions().device(device))})};
    if (world > 1) ctx.pg->allreduce(l)->wait();
    const double mean_loss = l[0][0].item<double>() / world;
    const bool signalled = l[0][1].item<float>() > 0;
    if (signalled || (a.checkpoint_every > 0 && step % a.checkpoint_every == 0)) {
      g_checkpoint_requested = false;
      save(step);
    }
    if (signalled && rank == 0 && dlrun::worker::requeueOnSignalRequested()) {
      // Preemption (dlrun slurm --preemptible): the checkpoint is on disk, hand the job back
      // to Slurm; the requeued run resumes from it. Slurm then stops this run.
      const std::string err = dlrun::worker::requeueSlurmJob();
      if (err.empty()) {
        std::printf("requeued Slurm job %s after the checkpoint at step %ld\n",
                    std::getenv("SLURM_JOB_ID"), step);
      } else {
        std::fprintf(stderr, "train_unet: %s\n", err.c_str());
      }
      std::fflush(stdout);
    }
    if (step == start_step + 1) first_loss = mean_loss;
    last_loss = mean_loss;
    epoch_loss += mean_loss;
    ++epoch_steps;
    if (tb) {
      const double el = std::chrono::duration<double>(Clock::now() - t0).count();
      tb->Scalar("train/loss", static_cast<float>(mean_loss), step);
      tb->Scalar("train/lr", static_cast<float>(lr), step);
      tb->Scalar("train/samples_per_sec",
                 static_cast<float>((step - start_step) * global_batch / el), step);
    }
    if (rank == 0) {
      const double el = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("step %ld/%ld  loss %.5f  lr %.3g  %.2f samples/s (all ranks, since start)\n",
                  step, a.max_steps, mean_loss, lr,
                  (step - start_step) * a.local_batch_size * world / el);
      std::fflush(stdout);
    }
    if (step % steps_per_epoch == 0 || step == a.max_steps) {
      // The tutorial's per-epoch report.
      const double secs = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      const int64_t epoch = (step - 1) / steps_per_epoch + 1;
      const auto val_start = Clock::now();
      const double val_loss = val_steps > 0 ? validate() : 0;
      const double val_secs = std::chrono::duration<double>(Clock::now() - val_start).count();
      if (tb) {
        if (val_steps > 0) tb->Scalar("val/loss", static_cast<float>(val_loss), step);
        tb->Flush();
      }
      if (rank == 0) {
        std::printf("Time taken for epoch %ld is %.3f sec, avg %.3f samples/sec\n", epoch, secs,
                    epoch_steps * global_batch / secs);
        std::printf("  Avg train loss=%.6f\n", epoch_loss / std::max<int64_t>(1, epoch_steps));
        if (val_steps > 0) {
          std::printf("  Avg val loss=%.6f\n  Total validation time: %.3f sec\n", val_loss,
                      val_secs);
        }
        std::fflush(stdout);
      }
      epoch_loss = 0;
      epoch_steps = 0;
      epoch_start = Clock::now();
    }
  }
  if (start_step < a.max_steps && !(a.checkpoint_every > 0 && a.max_steps % a.checkpoint_every == 0)) {
    save(a.max_steps);
  }
  const int64_t timed_steps = std::max<int64_t>(1, a.max_steps - start_step - a.warmup_steps);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const double sps = timed_steps * a.local_batch_size * world / secs;

  // Gather every rank's parameter digest so scripts can check the ranks agree bit for bit.
  const uint64_t final_digest = dlrun::worker::digest(params);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  std::vector<torch::Tensor> mine{torch::tensor({static_cast<int64_t>(final_digest)}, long_opts)};
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < world; ++r) all[0].push_back(torch::zeros({1}, long_opts));
  ctx.pg->allgather(all, mine)->wait();

  if (rank == 0) {
    std::printf("Time taken for %ld steps is %.3f sec, avg %.3f samples/sec\n", timed_steps, secs,
                sps);
    std::printf("final loss %.5f (first step %.5f), %.3f samples/s over %d rank(s)\n", last_loss,
                first_loss, sps, world);
    if (!a.metrics_json.empty()) {
      nlohmann::json j;
      j["world_size"] = world;
      j["steps"] = a.max_steps;
      j["samples_per_sec"] = sps;
      j["start_step"] = start_step;
      j["final_lr"] = lr;
      j["final_loss"] = last_loss;
      j["first_loss"] = first_loss;
      j["parameters"] = nparams;
      j["initial_param_digest"] = std::to_string(initial_digest);
      j["param_digests"] = nlohmann::json::array();
      for (const auto& t : all[0]) {
        j["param_digests"].push_back(std::to_string(static_cast<uint64_t>(t.item<int64_t>())));
      }
      std::ofstream out(a.metrics_json);
      out << j.dump(2) << "\n";
      if (!out) {
        std::fprintf(stderr, "train_unet: cannot write --metrics-json %s\n", a.metrics_json.c_str());
        return 1;
      }
    }
  }
  return 0;
}

// Fills the fields of `a` from configuration `name`, except those given as flags.
absl::Status ApplyConfig(const std::string& path, const std::string& name, const CLI::App& app,
                         Args* a) {
  auto cfg = dlrun::examples::LoadConfig(path, name);
  if (!cfg.ok()) return cfg.status();
  auto bad = [&](const std::string& key, const std::string& v, const char* expected) {
    return absl::InvalidArgumentError(absl::StrCat("configuration '", name, "' in ", path, ": ",
                                                   key, "='", v, "' is invalid: expected ",
                                                   expected));
  };
  auto get = [&](const std::string& key) -> const std::string* {
    auto it = cfg->find(key);
    return it == cfg->end() ? nullptr : &it->second;
  };
  auto set_int = [&](const char* flag, const std::string& key, int64_t* out) -> absl::Status {
    const std::string* v = get(key);
    if (v == nullptr || (flag && app.count(flag) > 0)) return absl::OkStatus();
    int64_t x = 0;
    if (!absl::SimpleAtoi(*v, &x) || x < 0) return bad(key, *v, "an integer >= 0");
    *out = x;
    return absl::OkStatus();
  };
  auto set_double = [&](const char* flag, const std::string& key, double* out) -> absl::Status {
    const std::string* v = get(key);
    if (v == nullptr || app.count(flag) > 0) return absl::OkStatus();
    double x = 0;
    if (!absl::SimpleAtod(*v, &x) || x < 0) return bad(key, *v, "a number >= 0");
    *out = x;
    return absl::OkStatus();
  };
  int64_t workers = a->num_data_workers, prefetch = a->prefetch_factor;
  for (absl::Status s : {set_int("--data-size", "data_size", &a->data_size),
                         set_int("--base-channels", "base_channels", &a->base_channels),
                         set_int("--num-data-workers", "num_data_workers", &workers),
                         set_int("--prefetch-factor", "prefetch_factor", &prefetch),
                         set_int("--base-batch-size", "base_batch_size", &a->base_batch_size),
                         set_int(nullptr, "global_batch_size", &a->global_batch_size),
                         set_int(nullptr, "num_epochs", &a->num_epochs),
                         set_int(nullptr, "Nsamples", &a->nsamples),
                         set_int(nullptr, "Nsamples_val", &a->nsamples_val),
                         set_int("--lr-warmup-steps", "lr_schedule.warmup_steps",
                                 &a->lr_warmup_steps),
                         set_double("--lr", "lr_schedule.start_lr", &a->lr),
                         set_double("--end-lr", "lr_schedule.end_lr", &a->end_lr),
                         set_double("--lambda-rho", "lambda_rho", &a->lambda_rho)}) {
    if (!s.ok()) return s;
  }
  a->num_data_workers = static_cast<int>(std::max<int64_t>(1, workers));
  a->prefetch_factor = static_cast<int>(std::max<int64_t>(1, prefetch));
  if (a->data_size <= 0 || a->data_size % 64 != 0) {
    return bad("data_size", std::to_string(a->data_size), "a positive multiple of 64");
  }
  if (const std::string* v = get("lr_schedule.scaling"); v && app.count("--lr-scaling") == 0) {
    if (*v != "none" && *v != "linear" && *v != "sqrt") return bad("lr_schedule.scaling", *v, "none, linear or sqrt");
    a->lr_scaling = *v;
  }
  if (const std::string* v = get("val_path")) a->val_path = *v;
  const bool data_given = app.count("--data") > 0 || app.count("--synthetic") > 0;
  if (const std::string* v = get("data_loader_config"); v && !data_given) {
    if (*v == "synthetic") {
      a->synthetic = true;
    } else if (*v == "inmem" || *v == "lowmem") {
      if (app.count("--data-mode") == 0) a->data_mode = *v;
      const std::string* path = get("train_path");
      if (path == nullptr || path->empty()) {
        return bad("train_path", path ? *path : "", "an HDF5 file for inmem / lowmem");
      }
      a->data = *path;
    } else {
      return bad("data_loader_config", *v, "synthetic, inmem or lowmem");
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace dlrun::examples {

int TrainUnetMain(int argc, char** argv) {
  Args a;
  CLI::App app{"train_unet: the SC22 3D U-Net on LibTorch with dlrun::worker"};
  app.add_flag("--synthetic", a.synthetic, "train on synthetic fields (no data files needed)");
  app.add_option("--base-channels", a.base_channels, "U-Net base width (tutorial: 64)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data-size", a.data_size, "crop edge length, a multiple of 64")
      ->check([](const std::string& s) {
        long v = std::atol(s.c_str());
        return (v > 0 && v % 64 == 0) ? std::string()
                                      : "expected a positive multiple of 64, got " + s;
      });
  app.add_option("--local-batch-size", a.local_batch_size, "samples per rank per step")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-steps", a.max_steps, "training steps")->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup-steps", a.warmup_steps, "steps left out of the samples/s figure")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--lr", a.lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "seed of the model initialisation and the data");
  app.add_flag("!--no-grad-sync", a.grad_sync, "skip the gradient allreduce (benchmarks)");
  app.add_option("--bucket-cap-mb", a.bucket_cap_mb, "DDP gradient bucket size (PyTorch: 25)")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-broadcast-buffers", a.broadcast_buffers,
               "do not broadcast module buffers from rank 0 before each forward");
  app.add_flag("--fp16-grad-compression", a.fp16_grad_compression,
               "send gradients as float16 through the process group (PyTorch's "
               "fp16_compress_hook; for jobs across hosts)");
  app.add_option("--metrics-json", a.metrics_json, "write final figures to this JSON file");
  app.add_option("--data", a.data, "HDF5 file with Nbody and Hydro datasets");
  app.add_option("--data-mode", a.data_mode, "inmem (read once) or lowmem (read each crop)")
      ->check(CLI::IsMember({"inmem", "lowmem"}));
  app.add_option("--num-data-workers", a.num_data_workers, "loader threads")
      ->check(CLI::Range(1, 256));
  app.add_option("--prefetch-factor", a.prefetch_factor, "samples queued per loader thread")
      ->check(CLI::Range(1, 1024));
  app.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "save checkpoints here and resume from the newest valid one");
  app.add_option("--checkpoint-every", a.checkpoint_every, "steps between checkpoints (0: end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--lr-scaling", a.lr_scaling, "large-batch LR scaling: none, linear or sqrt")
      ->check(CLI::IsMember({"none", "linear", "sqrt"}));
  app.add_option("--base-batch-size", a.base_batch_size, "batch the --lr is for (0: global)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--lr-warmup-steps", a.lr_warmup_steps, "linear LR warm-up when scaled")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--end-lr", a.end_lr, "LR at the end of the cosine decay")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lambda-rho", a.lambda_rho, "weight of the exp(14 x) density L1 term")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tensorboard-dir", a.tensorboard_dir,
                 "write TensorBoard event files (loss, val loss, LR, samples/s) here");
  app.add_option("--device", a.device, "auto (CUDA when available), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("!--no-amp", a.amp, "no mixed precision on CUDA (autocast + loss scaling)");
  app.add_flag("--channels-last{1},--no-channels-last{0}", a.channels_last,
               "channels-last 3D tensors (default: on CUDA only)");
  app.add_flag("--benchy", a.benchy,
               "throughput trials (IO, SYNTHETIC, FULL) of --max-steps steps each, then exit");
  app.add_option("--fail-at-step", a.fail_at_step,
                 "testing: the last rank exits 1 at this step of the first attempt");
  std::string yaml_config = "examples/unet/config/UNet.yaml", config;
  app.add_option("--yaml-config", yaml_config, "YAML file of named configurations");
  app.add_option("--config", config, "configuration to use (e.g. short, bs64_opt, cpu_tiny)");
  CLI11_PARSE(app, argc, argv);
  a.max_steps_given = app.count("--max-steps") > 0;
  a.local_batch_given = app.count("--local-batch-size") > 0;
  if (!config.empty()) {
    if (absl::Status s = ApplyConfig(yaml_config, config, app, &a); !s.ok()) {
      std::fprintf(stderr, "train_unet: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  if (a.synthetic == !a.data.empty()) {
    std::fprintf(stderr, "train_unet: give exactly one of --synthetic or --data PATH\n");
    return 2;
  }
  try {
    return Train(a);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    dlrun::worker::recordError("train_unet: " + what);
    std::fprintf(stderr, "train_unet: %s\n", what.c_str());
    return 1;
  }
}

}  // namespace dlrun::examples
