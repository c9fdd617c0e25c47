#include "unet/train_args.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "unet/config.h"
#include "worker/src/text.h"

namespace dlrun::examples {
namespace {

// Fills the fields of `a` from configuration `name`, except those given as flags.
lite::Status ApplyConfig(const std::string& path, const std::string& name, const CLI::App& app,
                         TrainArgs* a) {
  auto cfg = dlrun::examples::LoadConfig(path, name);
  if (!cfg.ok()) return cfg.status();
  auto bad = [&](const std::string& key, const std::string& v, const char* expected) {
    return lite::InvalidArgumentError(lite::StrCat("configuration '", name, "' in ", path, ": ",
                                                   key, "='", v, "' is invalid: expected ",
                                                   expected));
  };
  auto get = [&](const std::string& key) -> const std::string* {
    auto it = cfg->find(key);
    return it == cfg->end() ? nullptr : &it->second;
  };
  auto set_int = [&](const char* flag, const std::string& key, int64_t* out) -> lite::Status {
    const std::string* v = get(key);
    if (v == nullptr || (flag && app.count(flag) > 0)) return lite::OkStatus();
    int64_t x = 0;
    if (!lite::SimpleAtoi(*v, &x) || x < 0) return bad(key, *v, "an integer >= 0");
    *out = x;
    return lite::OkStatus();
  };
  auto set_double = [&](const char* flag, const std::string& key, double* out) -> lite::Status {
    const std::string* v = get(key);
    if (v == nullptr || app.count(flag) > 0) return lite::OkStatus();
    double x = 0;
    if (!lite::SimpleAtod(*v, &x) || x < 0) return bad(key, *v, "a number >= 0");
    *out = x;
    return lite::OkStatus();
  };
  int64_t workers = a->num_data_workers, prefetch = a->prefetch_factor;
  for (lite::Status s :
       {set_int("--data-size", "data_size", &a->data_size),
        set_int("--base-channels", "base_channels", &a->base_channels),
        set_int("--num-data-workers", "num_data_workers", &workers),
        set_int("--accumulation-steps", "accumulation_steps", &a->accumulation_steps),
        set_int("--prefetch-factor", "prefetch_factor", &prefetch),
        set_int("--base-batch-size", "base_batch_size", &a->base_batch_size),
        set_int(nullptr, "global_batch_size", &a->global_batch_size),
        set_int("--num-epochs", "num_epochs", &a->num_epochs),
        set_int(nullptr, "Nsamples", &a->nsamples),
        set_int(nullptr, "Nsamples_val", &a->nsamples_val),
        set_int("--lr-warmup-steps", "lr_schedule.warmup_steps", &a->lr_warmup_steps),
        set_double("--lr", "lr_schedule.start_lr", &a->lr),
        set_double("--end-lr", "lr_schedule.end_lr", &a->end_lr),
        set_double("--lambda-rho", "lambda_rho", &a->lambda_rho)}) {
    if (!s.ok()) return s;
  }
  if (get("num_data_workers") != nullptr) a->num_data_workers_given = true;  // a choice, kept
  a->accumulation_steps = std::max<int64_t>(1, a->accumulation_steps);
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
  return lite::OkStatus();
}

// The model, the batch, the optimiser and DDP.
void AddModelFlags(CLI::App& app, TrainArgs& a) {
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
  app.add_option("--accumulation-steps", a.accumulation_steps,
                 "micro-batches of --local-batch-size per optimizer step (gradient "
                 "accumulation; DDP syncs only the last): the effective batch is K times larger")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_flag("--checkpoint-activations", a.checkpoint_activations,
               "recompute each U-Net level in backward instead of keeping its activations "
               "(less memory, about one more forward pass)");
  app.add_flag("--measure-allocations", a.measure_allocations,
               "CPU: measure the most tensor memory allocated at once over the steps "
               "(metrics.json peak_allocated_bytes; CUDA always has it)");
  app.add_flag("--fp16-grad-compression", a.fp16_grad_compression,
               "send gradients as float16 through the process group (PyTorch's "
               "fp16_compress_hook; for jobs across hosts)");
}

// Data, metrics, checkpoints.
void AddDataFlags(CLI::App& app, TrainArgs& a) {
  app.add_option("--metrics-json", a.metrics_json, "write final figures to this JSON file");
  app.add_option("--data", a.data, "HDF5 file with Nbody and Hydro datasets");
  app.add_option("--data-mode", a.data_mode, "inmem (read once) or lowmem (read each crop)")
      ->check(CLI::IsMember({"inmem", "lowmem"}));
  app.add_option("--num-data-workers", a.num_data_workers, "loader threads")
      ->check(CLI::Range(1, 256));
  app.add_option("--prefetch-factor", a.prefetch_factor, "samples queued per loader thread")
      ->check(CLI::Range(1, 1024));
  app.add_option("--num-epochs", a.num_epochs,
                 "epochs of the configuration's Nsamples (without --config: of --max-steps "
                 "steps each)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_flag("!--rotate-in-loader", a.rotate_on_device,
               "rotate crops on the loader threads (default: on the device after the upload)");
}

// Checkpoints, the LR schedule, devices, benchmarks and testing.
void AddRunFlags(CLI::App& app, TrainArgs& a) {
  app.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "save checkpoints here and resume from the newest valid one");
  app.add_option("--checkpoint-every", a.checkpoint_every, "steps between checkpoints (0: end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--lr-scaling", a.lr_scaling, "large-batch LR scaling: none, linear or sqrt")
      ->check(CLI::IsMember({"none", "linear", "sqrt"}));
  app.add_option("--base-batch-size", a.base_batch_size, "batch the --lr is for (0: global)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--lr-warmup-steps", a.lr_warmup_steps, "linear LR warm-up over the first N steps (0: none)")
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
  app.add_option("--inject-inf-step", a.inject_inf_step,
                 "make the loss inf at this step (checks that the loss scaler skips it)");
  app.add_flag("--channels-last{1},--no-channels-last{0}", a.channels_last,
               "channels-last 3D tensors (default: on CUDA only)");
  app.add_flag("--deterministic", a.deterministic,
               "CUDA: deterministic cuDNN and algorithms, no autotuning (runs compared bit for "
               "bit); the CPU path is deterministic already");
  app.add_flag("--benchy", a.benchy,
               "throughput trials (IO, SYNTHETIC, FULL) of --max-steps steps each, then exit");
  app.add_option("--benchy-trials", a.benchy_trials,
                 "trials per benchy mode, reported as mean +/- spread")
      ->check(CLI::Range(1, 1000));
  app.add_flag("!--no-tf32", a.tf32,
               "no TF32 for CUDA matmuls and convolutions (as NVIDIA_TF32_OVERRIDE=0)");
  app.add_option("--target-loss", a.target_loss,
                 "record the time and step at which the validation loss first reaches this "
                 "(metrics.json: target_loss_step, target_loss_s)")
      ->check(CLI::PositiveNumber);
  app.add_option("--fail-at-step", a.fail_at_step,
                 "testing: the last rank exits 1 at this step of the first attempt");
  app.add_option("--fail-how", a.fail_how,
                 "testing: how --fail-at-step fails: exit (exit 1), kill (SIGKILL itself), "
                 "stop (SIGSTOP itself: its peers wait in a collective, a hang), or "
                 "kill-before-save (rank 0, the checkpoints' writer, SIGKILLs itself after the "
                 "step's commit, right before that step's checkpoint)")
      ->check(CLI::IsMember({"exit", "kill", "stop", "kill-before-save"}));
  app.add_option("--fail-replacement", a.fail_replacement,
                 "testing: the process replacing a lost rank (in-process recovery) hangs (never "
                 "joins) or differs (changes a parameter after taking the state)")
      ->check(CLI::IsMember({"hang", "differs"}));
}

}  // namespace

int ParseTrainArgs(int argc, char** argv, TrainArgs* a) {
  CLI::App app{"train_unet: the SC22 3D U-Net on LibTorch with dlrun::worker"};
  AddModelFlags(app, *a);
  AddDataFlags(app, *a);
  AddRunFlags(app, *a);
  std::error_code ec;
  std::string yaml_config =
      DefaultConfigFile(std::filesystem::read_symlink("/proc/self/exe", ec).string());
  std::string config;
  app.add_option("--yaml-config", yaml_config, "YAML file of named configurations");
  app.add_option("--config", config, "configuration to use (e.g. short, bs64_opt, cpu_tiny)");
  CLI11_PARSE(app, argc, argv);
  a->max_steps_given = app.count("--max-steps") > 0;
  a->local_batch_given = app.count("--local-batch-size") > 0;
  a->num_data_workers_given = app.count("--num-data-workers") > 0;
  if (!config.empty()) {
    if (lite::Status s = ApplyConfig(yaml_config, config, app, a); !s.ok()) {
      std::fprintf(stderr, "train_unet: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  if (a->synthetic == !a->data.empty()) {
    std::fprintf(stderr, "train_unet: give exactly one of --synthetic or --data PATH\n");
    return 2;
  }
  return -1;
}

}  // namespace dlrun::examples
