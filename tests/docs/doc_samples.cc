// Every code sample of the installed headers (worker/include/dlrun) and of the ```cpp blocks of
// README.md and docs/*.md, verbatim, inside enough context to compile.
// tests/docs/check_doc_samples.py checks that each sample's lines appear here in order, and the build compiles and links this file
// against dlrun::worker, so no sample can drift from the API. Not run (init() needs a job).
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dlrun/agent_link.h"
#include "dlrun/checkpoint.h"
#include "dlrun/data_sampler.h"
#include "dlrun/ddp.h"
#include "dlrun/lr_schedule.h"
#include "dlrun/recoverable.h"
#include "dlrun/recovery.h"
#include "dlrun/sync_batch_norm.h"
#include "dlrun/worker.h"

namespace {

struct NetImpl : torch::nn::Module {
  torch::nn::Linear l{nullptr};
  NetImpl() { l = register_module("l", torch::nn::Linear(4, 1)); }
  torch::Tensor forward(torch::Tensor x) { return l(x); }
};
TORCH_MODULE(Net);

struct Data : torch::data::datasets::Dataset<Data> {
  torch::data::Example<> get(size_t) override { return {torch::zeros({4}), torch::zeros({1})}; }
  torch::optional<size_t> size() const override { return 8; }
};

// worker.h
void WorkerSample(Net model, double loss_value) {
  auto ctx = dlrun::worker::init();          // reads RANK, WORLD_SIZE, MASTER_ADDR, ...
  dlrun::worker::DistributedDataParallel ddp(model, ctx.pg);
  auto loss_sum = ctx.all_reduce(torch::tensor({loss_value}));     // small collectives
  if (!ctx.ranks_agree(dlrun::worker::digest(model->parameters()))) std::abort();
  (void)loss_sum;
}

// ddp.h
void DdpSample(const dlrun::worker::Context& ctx, Net model, torch::optim::Optimizer& optimizer,
               torch::Tensor x, torch::Tensor y) {
  dlrun::worker::DistributedDataParallel ddp(model, ctx.pg);   // broadcasts rank 0's state
  torch::Tensor loss = torch::mse_loss(ddp(x), y);  // ddp(x): model->forward(x), same type
  loss.backward();                    // buckets are allreduced while backward runs;
  optimizer.step();                   // grads are averaged when backward returns
  {
    auto guard = ddp.no_sync();        // accumulate locally, no communication
    torch::mse_loss(ddp(x), y).backward();
  }
}

// ddp.h, communication hooks
struct CountingAllreduce : c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
  using CppCommHookInterface::CppCommHookInterface;
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    ++calls;
    return dlrun::worker::comm_hooks::allreduce(state_)->runHook(bucket);
  }
  int calls = 0;
};
void CommHookSample(const dlrun::worker::Context& ctx, Net model) {
  dlrun::worker::DistributedDataParallel ddp(model, ctx.pg);
  ddp.register_comm_hook(std::make_unique<CountingAllreduce>(ctx.pg));
}

// ddp.h, join()
void JoinSample(
    const dlrun::worker::Context& ctx, Net model, torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<torch::Tensor, torch::Tensor>>& my_uneven_share) {
  dlrun::worker::DistributedDataParallel ddp(model, ctx.pg);
  {
    auto joined = ddp.join();
    for (auto& [x, y] : my_uneven_share) {  // ranks may hold different numbers of batches
      optimizer.zero_grad();
      torch::mse_loss(ddp(x), y).backward();
      optimizer.step();
    }
  }  // returns once every rank is done
}

// sync_batch_norm.h
namespace sync_bn_sample {
struct NetImpl : torch::nn::Module {
  explicit NetImpl(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    conv = register_module("conv", torch::nn::Conv2d(3, 16, 3));
    bn = register_module("bn", dlrun::worker::SyncBatchNorm(16, pg));  // not BatchNorm2d(16)
  }
  torch::Tensor forward(torch::Tensor x) { return torch::relu(bn(conv(x))); }
  torch::nn::Conv2d conv{nullptr};
  dlrun::worker::SyncBatchNorm bn{nullptr};
};
TORCH_MODULE(Net);

void UseGroupSample(Net model, dlrun::worker::Context& ctx, dlrun::worker::Recovery::Outcome r) {
  if (r.recovered) dlrun::worker::use_group(*model, ctx.pg);
}
}  // namespace sync_bn_sample

// checkpoint.h
void CheckpointSample(const dlrun::worker::Context& ctx, Net model, torch::optim::Optimizer& opt,
                      int64_t step, int64_t epoch, int64_t b, torch::Tensor ema_weight,
                      double best_loss) {
  dlrun::worker::CheckpointManager ckpt({.dir = "ckpt"});
  dlrun::worker::TrainingState st{.step = step, .epoch = epoch, .epoch_position = b};
  st.tensors["ema.weight"] = ema_weight;           // extra state: tensors ...
  st.values["best_loss"] = best_loss;              // ... and values (any c10::IValue)
  if (ctx.rank() == 0) ckpt.save(*model, opt, st); // throws std::runtime_error on failure
  if (auto resumed = ckpt.resume_latest(*model, opt, ctx)) step = resumed->step;
}

// recovery.h
void RecoverySample(dlrun::worker::Context& ctx, Net model, torch::optim::Optimizer& optimizer,
                    dlrun::worker::CheckpointManager& ckpt, int64_t steps,
                    const std::function<void(dlrun::worker::DistributedDataParallel<Net>&, int64_t)>&
                        train_step) {
  dlrun::worker::Recovery recovery(ctx, *model, optimizer);
  int64_t start = 0;
  if (recovery.replacement()) {
    start = recovery.receive().step;  // before the DDP wrapper, as the survivors
  } else if (auto st = ckpt.resume_latest(*model, optimizer, ctx)) {
    start = st->step;
  }
  auto ddp = std::make_unique<dlrun::worker::DistributedDataParallel<Net>>(model, ctx.pg);
  for (int64_t step = start + 1; step <= steps; ++step) {
    const auto r = recovery.run([&] {
      train_step(*ddp, step);  // forward, backward
      recovery.update();       // in place of optimizer.step()
      recovery.commit(step);   // the step's end
    });
    if (r.recovered) {  // ctx.pg is the new group; every rank holds the state of r.step
      dlrun::worker::rebuild_after_recovery(ddp, ctx.pg);  // ddp.h: the wrapper anew
      step = r.step;  // the loop goes on with r.step + 1: the interrupted step again
    }
  }
}

// ddp.h, after a recovery
void RebuildSample(dlrun::worker::Context& ctx, dlrun::worker::Recovery::Outcome r, int64_t step,
                   std::unique_ptr<dlrun::worker::DistributedDataParallel<Net>>& ddp) {
  if (r.recovered) { dlrun::worker::rebuild_after_recovery(ddp, ctx.pg); step = r.step; }
  (void)step;
}

// recoverable.h
void RecoverableSample(dlrun::worker::Context& ctx, Net model, torch::optim::Optimizer& optimizer,
                       int64_t total_steps) {
  auto x_of = [](int64_t) { return torch::zeros({2, 4}); };
  auto y_of = [](int64_t) { return torch::zeros({2, 1}); };
  dlrun::worker::CheckpointManager ckpt({.dir = "ckpt"});
  dlrun::worker::Recoverable rec(ctx, model, optimizer, {.checkpoint = &ckpt});
  rec.run(total_steps, [&](int64_t step) {  // from the step after the one resumed
    optimizer.zero_grad();
    torch::mse_loss(rec.ddp()(x_of(step)), y_of(step)).backward();
    rec.update();  // optimizer.step(), undone if a peer is lost later in the step
    // anything after it (an EMA, a logging all-reduce, a checkpoint) is part of the step
  });
}

// docs/EMBEDDING.md, the recovery's rules in one program
using dlrun::worker::TrainingState;
void EmbeddingRecoverySample(int64_t steps) {
  auto x = [](int64_t) { return torch::zeros({2, 4}); };
  auto y = [](int64_t) { return torch::zeros({2, 1}); };
  auto log_allreduce = [](dlrun::worker::Context& c) { c.all_reduce(torch::ones({1})); };
  Net model;                                      // 1. model and optimizer before init():
  torch::optim::AdamW opt(model->parameters());   //    a warm spare has them built already
  auto ctx = dlrun::worker::init();
  dlrun::worker::CheckpointManager ckpt({.dir = "ckpt"});
  dlrun::worker::RecoverableOptions options;
  options.state = {[&] { return TrainingState{/* EMA, scaler... */}; },  // 2. state beyond
                   [&](const TrainingState&) { /* put it back */ }};    //    model and optimizer
  options.checkpoint = &ckpt;                     // 3. resumed from, collectively
  options.comm_hook = [](auto pg) { return dlrun::worker::comm_hooks::fp16_compress(pg); };
  dlrun::worker::Recoverable rec(ctx, model, opt, options);
  rec.run(steps, [&](int64_t step) {
    opt.zero_grad();
    torch::mse_loss(rec.ddp()(x(step)), y(step)).backward();  // 4. the step's data from `step`
    rec.update();                                 // 5. the update, undoable
    log_allreduce(ctx);                           //    anything after it is part of the step
    if (ctx.rank() == 0 && step % 100 == 0) ckpt.save(*model, opt, rec.checkpoint_state(step));
  });
}

// data_sampler.h
void DataSamplerSample(const dlrun::worker::Context& ctx, Net model, Data data, int64_t n,
                       size_t batch, int64_t epoch, const dlrun::worker::TrainingState* resumed) {
  dlrun::worker::DistributedDataParallel ddp(model, ctx.pg);
  auto dataset = data.map(torch::data::transforms::Stack<>());
  int64_t position = 0;
  dlrun::worker::DataLoaderSampler sampler({.dataset_size = n, .rank = ctx.rank(),
                                            .world_size = ctx.world_size(), .seed = 3});
  auto loader = torch::data::make_data_loader(dataset, sampler,
                                              torch::data::DataLoaderOptions(batch));
  sampler.set_epoch(epoch);                 // before each pass over the loader
  sampler.set_start(resumed->epoch_position);  // once, to go on mid-epoch after a resume
  for (auto& batch : *loader) {
    torch::mse_loss(ddp(batch.data), batch.target).backward();
    position = sampler.position();   // this rank's samples of the epoch so far
  }
  (void)position;
}

// lr_schedule.h
void LrSample(torch::optim::Optimizer& opt, int64_t step) {
  dlrun::worker::LrSchedule lr{.start_lr = 1e-3, .tot_steps = 1000, .warmup_steps = 100};
  dlrun::worker::validate(lr);  // throws std::invalid_argument naming the bad field
  for (const std::string& note : dlrun::worker::ineffective_settings(lr)) std::puts(note.c_str());
  dlrun::worker::set_learning_rate(opt, dlrun::worker::learning_rate(lr, step));
}

// docs/EMBEDDING.md (its #include lines are at the top of this file)
void ReadmeSample(Net model, torch::optim::Optimizer& optimizer, torch::Tensor x, torch::Tensor y) {
auto ctx = dlrun::worker::init();   // env of dlrun, torchrun, mpirun or srun -> TCPStore + Gloo
dlrun::worker::DistributedDataParallel ddp(model, ctx.pg, {.bucket_cap_mb = 25});
auto loss = torch::mse_loss(ddp(x), y);  // model->forward(x); broadcasts buffers when asked
loss.backward();                         // returns with gradients averaged
optimizer.step();
}

// dlrun/agent_link.h: HangPause.
void HangPauseSample(const std::function<void()>& evaluate) {
  { dlrun::worker::HangPause pause("eval"); evaluate(); }
}

}  // namespace

int main(int argc, char**) {
  if (argc > 1) {  // never: referenced so that every sample is compiled and linked
    Net model;
    torch::optim::SGD opt(model->parameters(), 0.1);
    auto ctx = dlrun::worker::init();
    WorkerSample(model, 0);
    DdpSample(ctx, model, opt, torch::zeros({2, 4}), torch::zeros({2, 1}));
    CheckpointSample(ctx, model, opt, 0, 0, 0, torch::zeros({1}), 0);
    DataSamplerSample(ctx, model, Data(), 8, 2, 0, nullptr);
    LrSample(opt, 0);
    ReadmeSample(model, opt, torch::zeros({2, 4}), torch::zeros({2, 1}));
    CommHookSample(ctx, model);
    JoinSample(ctx, model, opt, {});
    sync_bn_sample::Net sync_bn_net(ctx.pg);
    sync_bn_net(torch::zeros({2, 3, 8, 8}));
    HangPauseSample([] {});
  }
  return 0;
}
