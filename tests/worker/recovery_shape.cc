// The conformance sweep's C++ program (tests/system/recovery_shapes.sh; docs/RECOVERY.md, "A
// step is whole or not at all"): a 2-rank dlrun::worker trainer with BatchNorm in one of the
// shapes a LibTorch user writes, killed at points of a step, one after another in one run.
//   recovery_shape SHAPE STEPS CHECKPOINT_DIR
// SHAPE: bn (optimizer.step(), commit() right after it), bn_nobcast (the same, DDP's
// broadcast_buffers off), log_allreduce (Recovery::update(), an EMA and a logging all-reduce
// after it, commit() at the step's end), direct_tail (optimizer.step() itself, then the logging
// all-reduce, then commit(): a peer lost in that all-reduce must be refused), syncbn (bn with
// dlrun::worker::SyncBatchNorm, which must follow the new group after a recovery), fp16 / bf16
// (bn with the built-in comm hook, registered again on the rebuilt wrapper), resume (bn without
// commit() after the checkpoint resume, as docs/EMBEDDING.md's loop), dropout_once (Dropout, the
// CPU generator seeded once), allreduce_hook (bn with PyTorch's allreduce_hook), dropout_rank
// (seeded per rank by the trainer, Recovery::update(): each rank's generator gathered at the
// update and the commit), dropout_seeded (per rank through
// RecoveryOptions::seed_per_rank), object (RunObject: the loop written with
// dlrun::worker::Recoverable; object_rank: seeded per rank by the trainer), two_optimizers and two_optimizers_one (RunTwoOptimizers), and
// update_rank (log_allreduce with rank 1 updating twice in step 3).
// KILLS=STEP:RANK:POINT,...: as tests/python/shapes_train.py (start, backward, update, commit;
// object: also micro, between its two micro-steps).
// Lines: "rank R digest D buffers B" at the end (parameters and the EMA; the buffers).
#include <signal.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "dlrun/checkpoint.h"
#include "dlrun/ddp.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/recoverable.h"
#include "dlrun/recovery.h"
#include "dlrun/worker.h"

namespace {

struct NetImpl : torch::nn::Module {
  torch::nn::Linear inp{nullptr}, out{nullptr};
  torch::nn::AnyModule bn;
  torch::nn::Dropout drop{nullptr};
  NetImpl(c10::intrusive_ptr<c10d::ProcessGroup> sync_pg, double dropout) {
    inp = register_module("inp", torch::nn::Linear(8, 16));
    if (dropout > 0) drop = register_module("drop", torch::nn::Dropout(dropout));
    if (sync_pg) {
      bn = torch::nn::AnyModule(dlrun::worker::SyncBatchNorm(16, std::move(sync_pg)));
    } else {
      bn = torch::nn::AnyModule(torch::nn::BatchNorm1d(16));
    }
    register_module("bn", bn.ptr());
    out = register_module("out", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = torch::relu(bn.forward(inp(x)));
    return out(drop ? drop(h) : h);
  }
};
TORCH_MODULE(Net);

// KILLS: rank R SIGKILLs itself at (STEP, POINT), once per run (a marker file in `dir`).
class Killer {
 public:
  Killer(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {
    std::stringstream all(std::getenv("KILLS") ? std::getenv("KILLS") : "");
    for (std::string k; std::getline(all, k, ',');) {
      const size_t a = k.find(':'), b = k.rfind(':');
      if (a == std::string::npos || a == b) continue;
      kills_[{std::stoll(k.substr(0, a)), k.substr(b + 1)}] = std::stoi(k.substr(a + 1, b - a - 1));
    }
  }
  void At(int64_t step, const std::string& point) const {
    auto it = kills_.find({step, point});
    const std::string marker = dir_ + "/killed-" + std::to_string(step) + "-" + point;
    if (it == kills_.end() || it->second != rank_ || access(marker.c_str(), F_OK) == 0) return;
    std::ofstream(marker).put('\n');
    std::printf("rank %d killed at step %ld, %s\n", rank_, step, point.c_str());
    std::fflush(stdout);
    raise(SIGKILL);
  }

 private:
  std::string dir_;
  int rank_;
  std::map<std::pair<int64_t, std::string>, int> kills_;
};

void PrintEnd(int rank, Net& model, const std::vector<torch::Tensor>& ema) {
  std::vector<torch::Tensor> state = model->parameters();
  state.insert(state.end(), ema.begin(), ema.end());
  std::printf("rank %d digest %016lx buffers %016lx\n", rank,
              static_cast<unsigned long>(dlrun::worker::digest(state)),
              static_cast<unsigned long>(dlrun::worker::digest(model->buffers())));
}

// The object shape: the loop written with dlrun::worker::Recoverable (docs/EMBEDDING.md):
// BatchNorm, Dropout of each rank's own (RecoveryOptions::seed_per_rank), AdamW with a warm-up
// schedule, two micro-batches a step (the first under no_sync), the fp16 comm hook, an EMA as
// the trainer's state, a logging all-reduce after the update, the checkpoint inside the step.
// object_rank: the same with the CPU generator seeded per rank by the trainer, as PyTorch users do
// (torch::manual_seed(1000 + rank)), not through seed_per_rank.
int RunObject(dlrun::worker::Context& ctx, const std::string& shape, int64_t steps,
              const std::string& dir) {
  const int rank = ctx.rank();
  torch::manual_seed(0);
  Net model(nullptr, 0.3);
  if (shape == "object_rank") torch::manual_seed(1000 + rank);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  const dlrun::worker::LrSchedule schedule{.start_lr = 1e-2, .tot_steps = 20, .warmup_steps = 5};
  std::vector<torch::Tensor> ema;
  for (const auto& p : model->parameters()) ema.push_back(p.detach().clone());
  dlrun::worker::CheckpointManager ckpt({.dir = dir});
  dlrun::worker::RecoverableOptions options;
  options.state.capture = [&] {
    dlrun::worker::TrainingState st;
    for (size_t i = 0; i < ema.size(); ++i) st.tensors["ema." + std::to_string(i)] = ema[i];
    return st;
  };
  options.state.restore = [&](const dlrun::worker::TrainingState& st) {
    for (size_t i = 0; i < ema.size(); ++i) ema[i].copy_(st.tensors.at("ema." + std::to_string(i)));
  };
  if (shape == "object") options.recovery.seed_per_rank = 7;
  options.checkpoint = &ckpt;
  options.comm_hook = [](c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    return dlrun::worker::comm_hooks::fp16_compress(std::move(pg));
  };
  dlrun::worker::Recoverable rec(ctx, model, opt, std::move(options));
  if (rec.start_step() > 0) std::printf("rank %d resumed from step %ld\n", rank, rec.start_step());
  const Killer kill(dir, rank);
  int64_t current = 0;
  model->parameters()[0].register_hook([&](torch::Tensor g) {
    kill.At(current, "backward");
    return g;
  });
  rec.run(steps, [&](int64_t step) {
    current = step;
    kill.At(step - 1, "commit");  // between the steps: after the last one's end
    kill.At(step, "start");
    dlrun::worker::set_learning_rate(opt, dlrun::worker::learning_rate(schedule, step));
    opt.zero_grad();
    torch::Tensor loss;
    for (int micro = 0; micro < 2; ++micro) {
      torch::Generator g = at::detail::createCPUGenerator(10000 * step + 100 * rank + micro);
      const torch::Tensor x = torch::randn({8, 8}, g);
      std::optional<dlrun::worker::DistributedDataParallelBase::NoSyncGuard> local;
      if (micro == 0) local.emplace(&rec.ddp());
      loss = torch::mse_loss(rec.ddp()(x), x.sum(1, true).tanh());
      loss.backward();
      if (micro == 0) kill.At(step, "micro");  // between the micro-steps
    }
    rec.update();
    kill.At(step, "update");
    {
      torch::NoGradGuard no_grad;
      const auto params = model->parameters();
      for (size_t i = 0; i < ema.size(); ++i) ema[i].mul_(0.9).add_(params[i], 0.1);
    }
    ctx.all_reduce(loss.detach().clone());  // the loss for the log, after the update
    if (rank == 0 && step % 4 == 0) ckpt.save(*model, opt, rec.checkpoint_state(step));
  });
  PrintEnd(rank, model, ema);
  return 0;
}

// two_optimizers: AdamW for the first layer, SGD with momentum for the rest, both given to
// Recoverable (their states sent, undone and checkpointed); two_optimizers_one: only the
// first given, the second stepped in the update's apply: a recovery that sends the state
// must refuse (the second's momentum cannot be sent).
int RunTwoOptimizers(dlrun::worker::Context& ctx, const std::string& shape, int64_t steps,
                     const std::string& dir) {
  const int rank = ctx.rank();
  torch::manual_seed(0);
  Net model(nullptr, 0.0);
  torch::optim::AdamW first(model->inp->parameters(), torch::optim::AdamWOptions(1e-2));
  std::vector<torch::Tensor> rest = model->bn.ptr()->parameters();
  for (const auto& p : model->out->parameters()) rest.push_back(p);
  torch::optim::SGD second(rest, torch::optim::SGDOptions(1e-2).momentum(0.9));
  dlrun::worker::CheckpointManager ckpt({.dir = dir});
  dlrun::worker::RecoverableOptions options;
  options.checkpoint = &ckpt;
  const bool both = shape == "two_optimizers";
  std::optional<dlrun::worker::Recoverable<Net>> rec;
  if (both) {
    rec.emplace(ctx, model, std::vector<torch::optim::Optimizer*>{&first, &second}, options);
  } else {
    rec.emplace(ctx, model, first, options);
  }
  if (rec->start_step() > 0) std::printf("rank %d resumed from step %ld\n", rank, rec->start_step());
  const Killer kill(dir, rank);
  int64_t current = 0;
  model->parameters()[0].register_hook([&](torch::Tensor g) {
    kill.At(current, "backward");
    return g;
  });
  rec->run(steps, [&](int64_t step) {
    current = step;
    kill.At(step - 1, "commit");
    kill.At(step, "start");
    first.zero_grad();
    second.zero_grad();
    torch::Generator g = at::detail::createCPUGenerator(10000 * step + rank);
    const torch::Tensor x = torch::randn({8, 8}, g);
    torch::mse_loss(rec->ddp()(x), x.sum(1, true).tanh()).backward();
    if (both) {
      rec->update();  // steps both
    } else {
      rec->update({.apply = [&] { first.step(); second.step(); }});
    }
    kill.At(step, "update");
    if (rank == 0 && step % 4 == 0) ckpt.save(*model, first, rec->checkpoint_state(step));
  });
  PrintEnd(rank, model, {});
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) {
    std::fprintf(stderr, "usage: recovery_shape SHAPE STEPS DIR\n");
    return 2;
  }
  const std::string shape = argv[1], dir = argv[3];
  const int64_t steps = std::stoll(argv[2]);
  auto ctx = dlrun::worker::init();
  if (shape.rfind("object", 0) == 0) return RunObject(ctx, shape, steps, dir);
  if (shape.rfind("two_optimizers", 0) == 0) return RunTwoOptimizers(ctx, shape, steps, dir);
  const int rank = ctx.rank();
  torch::manual_seed(0);
  const bool dropout = shape.rfind("dropout", 0) == 0;
  Net model(shape == "syncbn" ? ctx.pg : nullptr, dropout ? 0.3 : 0.0);
  if (shape == "dropout_rank") torch::manual_seed(1000 + rank);  // each rank's own Dropout
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  std::vector<torch::Tensor> ema;
  for (const auto& p : model->parameters()) ema.push_back(p.detach().clone());
  dlrun::worker::RecoveryHooks hooks;
  hooks.capture = [&] {
    dlrun::worker::TrainingState st;
    for (size_t i = 0; i < ema.size(); ++i) st.tensors["ema." + std::to_string(i)] = ema[i];
    return st;
  };
  hooks.restore = [&](const dlrun::worker::TrainingState& st) {
    for (size_t i = 0; i < ema.size(); ++i) ema[i].copy_(st.tensors.at("ema." + std::to_string(i)));
  };
  dlrun::worker::RecoveryOptions recovery_options;
  if (shape == "dropout_seeded") recovery_options.seed_per_rank = 7;
  dlrun::worker::Recovery recovery(ctx, *model, opt, hooks, recovery_options);
  dlrun::worker::CheckpointManager ckpt({.dir = dir});
  int64_t start = 0;
  if (recovery.replacement()) {
    start = recovery.receive().step;
  } else if (auto st = ckpt.resume_latest(*model, opt, ctx)) {
    start = st->step;
    hooks.restore(*st);
    std::printf("rank %d resumed from step %ld\n", rank, start);
  }
  if (shape != "resume") recovery.commit(start);  // resume: the recovery learns it itself
  dlrun::worker::DDPOptions opts;
  opts.broadcast_buffers = shape != "bn_nobcast";
  auto ddp = std::make_unique<dlrun::worker::DistributedDataParallel<Net>>(model, ctx.pg, opts);
  auto register_hook = [&] {
    if (shape == "fp16") ddp->register_comm_hook(dlrun::worker::comm_hooks::fp16_compress(ctx.pg));
    if (shape == "bf16") ddp->register_comm_hook(dlrun::worker::comm_hooks::bf16_compress(ctx.pg));
    if (shape == "allreduce_hook") ddp->register_comm_hook(dlrun::worker::comm_hooks::allreduce(ctx.pg));
  };
  register_hook();
  const Killer killer(dir, rank);
  int64_t current = 0;
  auto kill_here = [&](int64_t step, const std::string& point) { killer.At(step, point); };
  model->parameters()[0].register_hook([&](torch::Tensor g) {
    kill_here(current, "backward");
    return g;
  });
  for (int64_t step = start + 1; step <= steps; ++step) {
    current = step;
    const auto r = recovery.run([&] {
      kill_here(step, "start");
      torch::Generator g = at::detail::createCPUGenerator(10000 * step + rank);
      const torch::Tensor x = torch::randn({8, 8}, g);
      opt.zero_grad();
      const torch::Tensor loss = torch::mse_loss((*ddp)(x), x.sum(1, true).tanh());
      loss.backward();
      if (shape == "log_allreduce" || shape == "update_rank" || shape == "dropout_rank") {
        recovery.update();
        // update_rank: rank 1 applies step 3's update twice (a bug of the trainer's): the
        // ranks' update counts differ from then on
        if (shape == "update_rank" && rank == 1 && step == 3) recovery.update();
      } else {
        opt.step();
      }
      kill_here(step, "update");
      if (shape != "log_allreduce" && shape != "direct_tail") recovery.commit(step);
      {
        torch::NoGradGuard no_grad;
        const auto params = model->parameters();
        for (size_t i = 0; i < ema.size(); ++i) ema[i].mul_(0.9).add_(params[i], 0.1);
      }
      if (shape == "log_allreduce" || shape == "direct_tail") {
        ctx.all_reduce(loss.detach().clone());  // the loss for the log, after the update
        recovery.commit(step);
      }
    });
    if (r.recovered) {
      dlrun::worker::rebuild_after_recovery(ddp, ctx.pg);  // the wrapper anew over the new group
      register_hook();
      step = r.step;
      continue;
    }
    kill_here(step, "commit");
    if (rank == 0 && step % 4 == 0) {
      dlrun::worker::TrainingState st = hooks.capture();
      st.step = step;
      ckpt.save(*model, opt, st);
    }
  }
  PrintEnd(rank, model, ema);
  return 0;
} catch (const std::exception& e) {
  dlrun::worker::record_error(e.what());
  std::fprintf(stderr, "recovery_shape: %s\n", e.what());
  return 1;
}
