// A small custom trainer embedding dlrun::worker: what a team's own C++ training program looks
// like. Linear regression on a synthetic dataset, with DDP, the distributed sampler, the SC22 LR
// schedule and elastic-restart checkpoints.
//   dlrun --nproc-per-node 2 custom_trainer [CHECKPOINT_DIR]
#include <torch/torch.h>

#include <cstdio>

#include "dlrun/checkpoint.h"
#include "dlrun/ddp.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/sampler.h"
#include "dlrun/worker.h"

int main(int argc, char** argv) try {
  auto ctx = dlrun::worker::init();  // dlrun, torchrun, mpirun or srun environment
  torch::manual_seed(0);
  auto model = torch::nn::Linear(16, 1);
  dlrun::worker::DistributedDataParallel ddp(model.ptr(), ctx.pg);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));

  // The data: y = x . w_true, 256 samples, the same on every rank (each visits its share).
  torch::manual_seed(1);
  const auto x = torch::randn({256, 16});
  const auto y = x.matmul(torch::randn({16, 1}));
  dlrun::worker::DistributedSampler sampler(
      {.dataset_size = 256, .rank = ctx.rank(), .world_size = ctx.worldSize(), .seed = 3});
  dlrun::worker::LrSchedule lr{.start_lr = 0.05, .end_lr = 0.001, .tot_steps = 80,
                               .warmup_steps = 5, .global_batch_size = 16L * ctx.worldSize(),
                               .base_batch_size = 16, .scaling = "sqrt"};

  dlrun::worker::CheckpointManager ckpt({.dir = argc > 1 ? argv[1] : ""});
  int64_t step = 0;
  if (argc > 1) {
    auto resumed = ckpt.resumeLatest(*model, opt, [](const std::string& w) {
      std::fprintf(stderr, "warning: %s\n", w.c_str());
    });
    if (resumed.ok() && resumed->has_value()) step = (*resumed)->step;
  }
  double loss_value = 0;
  for (int64_t epoch = step / 8; step < 80; ++epoch) {
    sampler.setEpoch(epoch);
    const auto idx = torch::tensor(sampler.indices());
    for (int64_t b = 0; b + 16 <= idx.size(0) && step < 80; b += 16, ++step) {
      const auto batch = idx.narrow(0, b, 16);
      dlrun::worker::SetLearningRate(opt, dlrun::worker::LearningRate(lr, step));
      opt.zero_grad();
      auto loss = torch::mse_loss(ddp.forward<torch::Tensor>(model, x.index_select(0, batch)),
                                  y.index_select(0, batch));
      loss.backward();
      opt.step();
      loss_value = loss.item<double>();
    }
    if (argc > 1 && ctx.rank() == 0) {
      if (auto s = ckpt.save(*model, opt, {.step = step, .epoch = epoch}); !s.ok()) {
        std::fprintf(stderr, "checkpoint: %s\n", std::string(s.message()).c_str());
      }
    }
  }
  std::printf("custom_trainer rank %d: %ld steps, final loss %.6f\n", ctx.rank(), step, loss_value);
  return loss_value < 0.05 ? 0 : 1;
} catch (const std::exception& e) {
  dlrun::worker::recordError(e.what());
  std::fprintf(stderr, "custom_trainer: %s\n", e.what());
  return 1;
}
