// The train_unet program: the SC22 tutorial's U-Net trainer on LibTorch + dlrun::worker.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "dlrun/ddp.h"
#include "dlrun/worker.h"
#include "nlohmann/json.hpp"
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
  std::string metrics_json;
};

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

int Train(const Args& a) {
  dlrun::worker::Context ctx = dlrun::worker::init();
  const int rank = ctx.rank();
  const int world = ctx.worldSize();
  torch::manual_seed(a.seed);  // identical init everywhere; rank 0's values are broadcast anyway

  dlrun::examples::UNet model(dlrun::examples::UNetOptions{4, 5, a.base_channels});
  std::vector<torch::Tensor> params = model->parameters();
  const uint64_t initial_digest = dlrun::worker::digest(params);
  dlrun::worker::DDPOptions ddp_opts;
  ddp_opts.bucket_cap_mb = a.bucket_cap_mb;
  ddp_opts.broadcast_buffers = a.broadcast_buffers;
  dlrun::worker::DistributedDataParallel ddp(model.ptr(), ctx.pg, ddp_opts);
  int64_t nparams = 0;
  for (const auto& p : params) nparams += p.numel();

  torch::optim::Adam opt(params, torch::optim::AdamOptions(a.lr));
  SyntheticData data(a.data_size, a.seed, rank);
  if (rank == 0) {
    std::printf("train_unet: %d rank(s), base width %ld (%.2f M parameters), %ld^3 crops, "
                "local batch %ld, %d thread(s) per rank, gradient sync %s\n",
                world, a.base_channels, nparams / 1e6, a.data_size, a.local_batch_size,
                torch::get_num_threads(), a.grad_sync ? "on" : "off");
    std::printf("%s\n", ddp.bucketReport().c_str());
    std::fflush(stdout);
  }

  using Clock = std::chrono::steady_clock;
  Clock::time_point t0 = Clock::now(), start = t0;
  double first_loss = 0, last_loss = 0;
  for (int64_t step = 1; step <= a.max_steps; ++step) {
    if (step == a.warmup_steps + 1) start = Clock::now();
    auto [x, y] = data.Batch(a.local_batch_size);
    opt.zero_grad();
    torch::Tensor loss;
    if (a.grad_sync) {
      loss = torch::l1_loss(ddp.forward<torch::Tensor>(model, x), y);
      loss.backward();  // gradients are averaged over ranks when this returns
    } else {
      auto local_only = ddp.noSync();  // benchmarks: the same step without communication
      loss = torch::l1_loss(model->forward(x), y);
      loss.backward();
    }
    opt.step();
    dlrun::worker::heartbeat();

    // Report the loss averaged over ranks.
    std::vector<torch::Tensor> l{loss.detach().reshape({1}).clone()};
    if (world > 1) ctx.pg->allreduce(l)->wait();
    const double mean_loss = l[0].item<double>() / world;
    if (step == 1) first_loss = mean_loss;
    last_loss = mean_loss;
    if (rank == 0) {
      const double el = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("step %ld/%ld  loss %.5f  %.2f samples/s (all ranks, since start)\n", step,
                  a.max_steps, mean_loss, step * a.local_batch_size * world / el);
      std::fflush(stdout);
    }
  }
  const int64_t timed_steps = std::max<int64_t>(1, a.max_steps - a.warmup_steps);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const double sps = timed_steps * a.local_batch_size * world / secs;

  // Gather every rank's parameter digest so scripts can check the ranks agree bit for bit.
  const uint64_t final_digest = dlrun::worker::digest(params);
  std::vector<torch::Tensor> mine{torch::tensor({static_cast<int64_t>(final_digest)})};
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < world; ++r) all[0].push_back(torch::zeros({1}, torch::kLong));
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
  app.add_option("--metrics-json", a.metrics_json, "write final figures to this JSON file");
  CLI11_PARSE(app, argc, argv);
  if (!a.synthetic) {
    std::fprintf(stderr, "train_unet: only --synthetic data is supported in this build\n");
    return 2;
  }
  if (a.warmup_steps >= a.max_steps) a.warmup_steps = 0;
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
