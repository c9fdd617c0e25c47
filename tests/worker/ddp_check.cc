// ddp_check: run under `dlrun --nproc-per-node 2`; checks dlrun::worker::DistributedDataParallel
// against a single-process reference computed on every rank. Exit 0 and "ddp_check ok" on
// success, 1 with the reason otherwise.
//   ddp_check --mode adam|nosync|buffers-on|buffers-off|unused-error|unused-ok|reload|reorder|fp16|
//                    hook|syncbn|init-sync|ready-order
// The twin modes train what tests/worker/ddp_twin.py trains with PyTorch's Python DDP and write
// each rank's final parameters (float64, registration order) to DIR/cc-rank<RANK>.bin:
//   ddp_check --mode twin-fp16|twin-bf16|twin-static|twin-join --out DIR
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "dlrun/ddp.h"
#include "dlrun/sync_batch_norm.h"
#include "dlrun/worker.h"

namespace {

namespace nn = torch::nn;
using dlrun::worker::DDPOptions;
using dlrun::worker::DistributedDataParallel;

struct NetImpl : nn::Module {
  nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, unused{nullptr};
  nn::BatchNorm1d bn{nullptr};
  bool with_bn;
  // `reordered`: the layers are registered last-used first (c, b, a), so reverse registration
  // order is not the order backward produces gradients in.
  NetImpl(bool with_bn_, bool with_unused, bool reordered = false) : with_bn(with_bn_) {
    if (reordered) {
      c = register_module("c", nn::Linear(32, 4));
      b = register_module("b", nn::Linear(32, 32));
    }
    a = register_module("a", nn::Linear(8, 32));
    if (!reordered) {
      b = register_module("b", nn::Linear(32, 32));
      c = register_module("c", nn::Linear(32, 4));
    }
    if (with_unused) unused = register_module("unused", nn::Linear(32, 4));
    if (with_bn) bn = register_module("bn", nn::BatchNorm1d(32));
  }
  torch::Tensor forward(torch::Tensor x, bool use_unused = false) {
    x = torch::tanh(a->forward(x));
    if (with_bn) x = bn->forward(x);
    x = torch::tanh(b->forward(x));
    return use_unused ? unused->forward(x) : c->forward(x);
  }
};
TORCH_MODULE(Net);

double MaxRelDiff(const std::vector<torch::Tensor>& x, const std::vector<torch::Tensor>& y) {
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    auto d = (x[i] - y[i]).abs() / (y[i].abs() + 1e-12);
    worst = std::max(worst, d.max().item<double>());
  }
  return worst;
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "ddp_check FAILED: %s\n", why.c_str());
  return 1;
}

// ddp_twin.py's Net and training, step for step.
struct TwinNetImpl : nn::Module {
  nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, unused{nullptr};
  explicit TwinNetImpl(bool with_unused) {
    a = register_module("a", nn::Linear(8, 32));
    b = register_module("b", nn::Linear(32, 32));
    c = register_module("c", nn::Linear(32, 4));
    if (with_unused) unused = register_module("unused", nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    return c(torch::tanh(b(torch::tanh(a(x)))));
  }
};
TORCH_MODULE(TwinNet);

int RunTwin(const std::string& mode, const std::string& out_dir) {
  auto ctx = dlrun::worker::init();
  const int rank = ctx.rank(), world = ctx.world_size();
  constexpr int kSteps = 5, kLocal = 4;
  torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  TwinNet model(mode == "twin-static");
  torch::manual_seed(7);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.copy_(torch::randn(p.sizes()) * 0.3);
  }
  DDPOptions opts;
  opts.static_graph = mode == "twin-static";
  DistributedDataParallel ddp(model, ctx.pg, opts);
  if (mode == "twin-fp16") ddp.register_comm_hook(dlrun::worker::comm_hooks::fp16_compress(ctx.pg));
  if (mode == "twin-bf16") ddp.register_comm_hook(dlrun::worker::comm_hooks::bf16_compress(ctx.pg));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  const bool join = mode == "twin-join";
  const int steps = join ? kSteps + 2 * rank : kSteps;
  const int most = join ? kSteps + 2 * (world - 1) : kSteps;
  torch::manual_seed(100);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < most; ++i) {
    auto x = torch::randn({world * kLocal, 8});
    auto y = torch::randn({world * kLocal, 4});
    data.emplace_back(x, y);
  }
  const auto train = [&] {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      auto x = data[i].first.narrow(0, rank * kLocal, kLocal);
      auto y = data[i].second.narrow(0, rank * kLocal, kLocal);
      torch::mse_loss(ddp(x), y).backward();
      opt.step();
    }
  };
  if (join) {
    auto joined = ddp.join();
    train();
  } else {
    train();
  }
  std::vector<torch::Tensor> flat;
  for (auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
  torch::Tensor all = torch::cat(flat).to(torch::kDouble).contiguous();
  std::ofstream f(out_dir + "/cc-rank" + std::to_string(rank) + ".bin", std::ios::binary);
  f.write(static_cast<const char*>(all.data_ptr()), all.numel() * sizeof(double));
  if (!f) return Fail("cannot write to " + out_dir);
  std::printf("ddp_check ok: %s, rank %d, %d steps; %s\n", mode.c_str(), rank, steps,
              ddp.bucket_report().c_str());
  return 0;
}

// A hook sees every bucket once per step, in order, with its parameters; what it returns
// becomes the gradients.
struct CountingAllreduce
    : c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
  using CppCommHookInterface::CppCommHookInterface;
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    if (bucket.getIndex() != next) {
      throw std::runtime_error("bucket " + std::to_string(bucket.getIndex()) + " came when " +
                               std::to_string(next) + " was due");
    }
    next = bucket.isLast() ? 0 : next + 1;
    steps += bucket.isLast() ? 1 : 0;
    params += bucket.getParameters().size();
    if (bucket.getGradients().size() != bucket.getParameters().size()) {
      throw std::runtime_error("getGradients() and getParameters() differ in length");
    }
    return dlrun::worker::comm_hooks::allreduce(state_)->runHook(bucket);
  }
  size_t next = 0, steps = 0, params = 0;
};

// The model of the syncbn mode: BatchNorm between a and b; `sync` picks SyncBatchNorm.
struct BnNetImpl : nn::Module {
  nn::Linear a{nullptr}, b{nullptr};
  nn::BatchNorm1d bn{nullptr};
  dlrun::worker::SyncBatchNorm sbn{nullptr};
  BnNetImpl(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    a = register_module("a", nn::Linear(8, 16));
    if (pg) {
      sbn = register_module("bn", dlrun::worker::SyncBatchNorm(16, pg));
    } else {
      bn = register_module("bn", nn::BatchNorm1d(16));
    }
    b = register_module("b", nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = a(x);
    x = sbn ? sbn(x) : bn(x);
    return b(torch::tanh(x));
  }
};
TORCH_MODULE(BnNet);

// SyncBatchNorm over two ranks' halves is BatchNorm over the whole batch in one process:
// outputs, gradients (so trained parameters) and running statistics.
int RunSyncBatchNorm() {
  auto ctx = dlrun::worker::init();
  const int rank = ctx.rank(), world = ctx.world_size();
  torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  constexpr int kLocal = 3;  // small per-rank batches: what SyncBatchNorm is for
  torch::manual_seed(3);
  BnNet model(ctx.pg);
  torch::manual_seed(3);
  BnNet reference(c10::intrusive_ptr<c10d::ProcessGroup>{});  // plain BatchNorm1d
  DistributedDataParallel ddp(model, ctx.pg);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam ref_opt(reference->parameters(), torch::optim::AdamOptions(1e-2));
  torch::manual_seed(100);
  for (int step = 0; step < 6; ++step) {
    auto x = torch::randn({world * kLocal, 8}) * 2 + 1;
    auto y = torch::randn({world * kLocal, 4});
    opt.zero_grad();
    auto out = ddp(x.narrow(0, rank * kLocal, kLocal));
    torch::mse_loss(out, y.narrow(0, rank * kLocal, kLocal)).backward();
    opt.step();
    ref_opt.zero_grad();
    auto ref_out = reference->forward(x);
    torch::mse_loss(ref_out, y).backward();
    ref_opt.step();
    const double d = (out - ref_out.narrow(0, rank * kLocal, kLocal)).abs().max().item<double>();
    if (!(d <= 1e-9)) return Fail("syncbn: step " + std::to_string(step) + " output differs by " + std::to_string(d));
  }
  std::vector<torch::Tensor> p = model->parameters(), q = reference->parameters();
  p.push_back(model->sbn->running_mean);
  p.push_back(model->sbn->running_var);
  q.push_back(reference->bn->running_mean);
  q.push_back(reference->bn->running_var);
  const double diff = MaxRelDiff(p, q);
  if (!(diff <= 1e-6)) return Fail("syncbn: max relative difference " + std::to_string(diff));
  model->eval();
  reference->eval();
  auto probe = torch::randn({5, 8});
  const double eval_diff = (model->forward(probe) - reference->forward(probe)).abs().max().item<double>();
  if (!(eval_diff <= 1e-9)) return Fail("syncbn: eval output differs by " + std::to_string(eval_diff));
  std::printf("ddp_check ok: syncbn, %d ranks of %d samples, max relative difference %.3g "
              "(parameters and running statistics)\n", world, kLocal, diff);
  return 0;
}

// Ranks built with different bucket caps (issue 40): DDP's construction fails on every rank
// with one line naming the setting and each rank's value, never a hang.
int RunMismatch() {
  auto ctx = dlrun::worker::init();
  torch::manual_seed(7);
  Net model(false, false, false);
  DDPOptions opts;
  opts.bucket_cap_mb = ctx.rank() == 0 ? 25 : 5;
  try {
    DistributedDataParallel ddp(model, ctx.pg, opts);
  } catch (const std::runtime_error& e) {
    // Exit 0: both ranks refuse, and neither exit may cut the other's line short (the agent
    // stops the group at the first failure).
    std::printf("ddp_check refused: %s\n", e.what());
    return 0;
  }
  return Fail("different bucket caps were accepted");
}

// A communication hook registered on rank 1 only, after the construction (issue 55: it hung in
// the shared-memory wait): the first forward fails on every rank with one line naming it.
int RunHookMismatch() {
  auto ctx = dlrun::worker::init();
  torch::manual_seed(7);
  Net model(false, false, false);
  DistributedDataParallel ddp(model, ctx.pg);
  if (ctx.rank() == 1) ddp.register_comm_hook(dlrun::worker::comm_hooks::fp16_compress(ctx.pg));
  try {
    torch::mse_loss(ddp(torch::randn({4, 8})), torch::zeros({4, 4})).backward();
  } catch (const std::runtime_error& e) {
    std::printf("ddp_check refused: %s\n", e.what());
    return 0;
  }
  return Fail("a hook on one rank only was accepted");
}

// DDPOptions::init_sync: false keeps each rank's own parameters (after an in-process recovery
// they agree already), the default broadcasts rank 0's.
int RunInitSync() {
  auto ctx = dlrun::worker::init();
  torch::manual_seed(7 + ctx.rank());  // every rank its own values
  Net model(false, false, false);
  DDPOptions off;
  off.init_sync = false;
  { DistributedDataParallel ddp(model, ctx.pg, off); }
  if (ctx.ranks_agree(dlrun::worker::digest(model->parameters()))) {
    return Fail("init_sync = false broadcast rank 0's parameters");
  }
  { DistributedDataParallel ddp(model, ctx.pg); }
  if (!ctx.ranks_agree(dlrun::worker::digest(model->parameters()))) {
    return Fail("the default init_sync left the ranks' parameters apart");
  }
  std::printf("ddp_check ok: init-sync, rank %d\n", ctx.rank());
  return 0;
}

// DDPOptions::ready_order (the wrapper made anew after an in-process recovery): every rank takes
// the order of the lowest rank that has one (rank 1 has none, as a replacement), its buckets
// start in it with no rebuild, and ready_order() gives it back.
int RunReadyOrder() {
  auto ctx = dlrun::worker::init();
  torch::manual_seed(7);
  Net model(false, false, false);
  std::vector<size_t> order;  // registration order: PyTorch's first buckets are the reverse
  std::string first;
  for (const auto& p : model->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    if (order.empty()) first = p.key();
    order.push_back(order.size());
  }
  DDPOptions opts;
  opts.init_sync = false;
  if (ctx.rank() == 0) opts.ready_order = order;
  DistributedDataParallel ddp(model, ctx.pg, opts);
  if (ddp.ready_order() != order) return Fail("the ranks did not take rank 0's bucket order");
  if (ddp.buckets().front().parameters.front() != first) {
    return Fail("the first bucket does not start with the order's first parameter " + first);
  }
  DistributedDataParallel fresh(model, ctx.pg);  // no order given: PyTorch's, until a step
  if (!fresh.ready_order().empty()) return Fail("a fresh wrapper claims an agreed order");
  std::printf("ddp_check ok: ready-order, rank %d\n", ctx.rank());
  return 0;
}

int Run(const std::string& mode) {
  if (mode == "syncbn") return RunSyncBatchNorm();
  if (mode == "ready-order") return RunReadyOrder();
  if (mode == "mismatch") return RunMismatch();
  if (mode == "hook-mismatch") return RunHookMismatch();
  if (mode == "init-sync") return RunInitSync();
  auto ctx = dlrun::worker::init();
  const int rank = ctx.rank(), world = ctx.world_size();
  torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  constexpr int kSteps = 5, kLocal = 4;
  const bool bn = mode.rfind("buffers", 0) == 0;
  const bool extra = mode.rfind("unused", 0) == 0;  // a layer forward never uses

  const bool reordered = mode == "reorder";
  torch::manual_seed(7);
  Net model(bn, extra, reordered);
  torch::manual_seed(7);
  Net reference(bn, extra, reordered);  // same initial values: trained on the global batch

  DDPOptions opts;
  opts.bucket_cap_mb = 0.002;  // ~2 KB: several buckets, so ordering and overlap are exercised
  opts.first_bucket_cap_mb = 0.001;
  opts.broadcast_buffers = mode != "buffers-off";
  opts.find_unused_parameters = mode == "unused-ok";
  opts.fp16_compression = mode == "fp16";
  DistributedDataParallel ddp(model, ctx.pg, opts);
  CountingAllreduce* counting = nullptr;
  if (mode == "hook" || mode == "nosync-forward") {
    auto hook = std::make_unique<CountingAllreduce>(ctx.pg);
    counting = hook.get();
    ddp.register_comm_hook(std::move(hook));
  }
  if (mode == "reload") {
    // Loading a checkpoint after wrapping (as a resuming trainer may) replaces the parameters'
    // gradient accumulators; the reducer must still see every gradient.
    std::stringstream ss;
    torch::serialize::OutputArchive out;
    model->save(out);
    out.save_to(ss);
    torch::serialize::InputArchive in;
    in.load_from(ss);
    model->load(in);
  }
  if (rank == 0) std::printf("%s\n", ddp.bucket_report().c_str());
  if (ddp.buckets().size() < 3) return Fail("expected several buckets");
  const auto first_layer = [&] { return ddp.buckets().front().parameters.front().substr(0, 2); };
  if (reordered && first_layer() != "a.") {
    return Fail("before the first step the first bucket should hold a (reverse registration), "
                "not " + ddp.buckets().front().parameters.front());
  }

  // Adam everywhere except fp16: Adam's update g/sqrt(v) turns float16's rounding of tiny
  // gradients into full-size steps, while SGD's error stays proportional to the gradient.
  const auto make_opt = [&](Net& net) -> std::unique_ptr<torch::optim::Optimizer> {
    if (mode == "fp16") {
      return std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
    }
    return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
  };
  auto opt = make_opt(model);
  auto ref_opt = make_opt(reference);
  torch::manual_seed(100);
  for (int step = 0; step < kSteps; ++step) {
    // The global batch: world x kLocal samples, two micro-batches each; rank r owns slice r.
    auto x = torch::randn({2, world * kLocal, 8});
    auto y = torch::randn({2, world * kLocal, 4});
    auto mine = [&](int mb, const torch::Tensor& t) { return t[mb].narrow(0, rank * kLocal, kLocal); };
    opt->zero_grad();
    if (mode == "nosync") {
      {
        auto guard = ddp.no_sync();
        ddp.prepare_forward();
        torch::mse_loss(model->forward(mine(0, x)), mine(0, y)).backward();
      }
      ddp.prepare_forward();
      torch::mse_loss(model->forward(mine(1, x)), mine(1, y)).backward();
    } else if (mode == "nosync-forward") {
      // The Python habit: only the forward under the guard, backward after it ended. The
      // forward decides, as in PyTorch: the first backward stays local (the hook counts one
      // reduced backward a step).
      torch::Tensor local;
      {
        auto guard = ddp.no_sync();
        local = torch::mse_loss(ddp(mine(0, x)), mine(0, y));
      }
      local.backward();
      torch::mse_loss(ddp(mine(1, x)), mine(1, y)).backward();
    } else if (mode.rfind("unused", 0) == 0) {
      ddp.prepare_forward();
      try {
        torch::mse_loss(model->forward(mine(0, x)), mine(0, y)).backward();
      } catch (const std::exception& e) {
        std::string what = e.what();
        if (mode == "unused-error" && what.find("unused.weight") != std::string::npos &&
            what.find("find_unused_parameters") != std::string::npos) {
          std::printf("ddp_check ok: %s\n", what.substr(0, what.find('\n')).c_str());
          return 0;
        }
        return Fail("unexpected error: " + what.substr(0, what.find('\n')));
      }
      if (mode == "unused-error") return Fail("an unused parameter was not reported");
    } else if (mode == "reload") {
      // After a load by set_() (new gradient accumulators), model->forward() directly, without
      // the wrapper: the gradients must still be averaged.
      torch::mse_loss(model->forward(mine(0, x)), mine(0, y)).backward();
    } else {
      torch::mse_loss(ddp(mine(0, x)), mine(0, y)).backward();
    }
    opt->step();

    // Reference on the global batch. DDP averages per-rank mean losses; with equal local
    // batches that is the mean over the global batch (summed over micro-batches for nosync).
    ref_opt->zero_grad();
    torch::Tensor ref_loss;
    if (mode == "nosync" || mode == "nosync-forward") {
      ref_loss = torch::zeros({});
      for (int mb = 0; mb < 2; ++mb) {
        ref_loss = ref_loss + torch::mse_loss(reference->forward(x[mb]), y[mb]);
      }
    } else {
      ref_loss = torch::mse_loss(reference->forward(x[0]), y[0]);
    }
    ref_loss.backward();
    ref_opt->step();
  }

  if (bn) {
    // Buffers: after a final broadcast (the next forward's), every rank holds rank 0's
    // running statistics when broadcast_buffers is on; each keeps its own when off.
    ddp.prepare_forward();
    auto mean = model->bn->running_mean.clone().reshape({1, -1});
    std::vector<torch::Tensor> in{mean};
    std::vector<std::vector<torch::Tensor>> all(1);
    for (int r = 0; r < world; ++r) all[0].push_back(torch::zeros_like(mean));
    ctx.pg->allgather(all, in)->wait();
    const bool same = torch::equal(all[0][0], all[0][1]);
    if (same != (mode == "buffers-on")) {
      return Fail(mode + ": ranks' BatchNorm running_mean " + (same ? "agree" : "differ"));
    }
    std::printf("ddp_check ok: %s, running_mean %s across ranks\n", mode.c_str(),
                same ? "identical" : "different");
    return 0;
  }
  if (mode != "unused-error") {
    // After the first step the buckets follow the order gradients arrived in: the last layer
    // (c) first. Every rank uses rank 0's order.
    std::printf("after training: %s\n", ddp.bucket_report().c_str());
    if (first_layer() != "c.") {
      return Fail("after the first step the first bucket holds " +
                  ddp.buckets().front().parameters.front() + ", expected the last layer's");
    }
  }
  std::vector<torch::Tensor> p = model->parameters(), q = reference->parameters();
  if (mode == "unused-ok") {
    // The unused layer got zero gradients everywhere: identical on every rank.
    p = {model->a->weight, model->b->weight, model->c->weight, model->unused->weight};
    q = {reference->a->weight, reference->b->weight, reference->c->weight,
         reference->unused->weight};
  }
  if (mode == "fp16") {
    // Gradients travel as float16: close to the reference, but visibly not equal to it (the
    // exact modes agree to ~1e-14).
    double worst = 0, scale = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      worst = std::max(worst, (p[i] - q[i]).abs().max().item<double>());
      scale = std::max(scale, q[i].abs().max().item<double>());
    }
    const double rel = worst / scale;
    if (ddp.bucket_report().find("fp16-compressed") == std::string::npos) {
      return Fail("fp16: the report does not say fp16-compressed: " + ddp.bucket_report());
    }
    if (!(rel > 1e-9 && rel < 1e-3)) {
      return Fail("fp16: max difference " + std::to_string(rel) +
                  " of the largest parameter, expected between 1e-9 and 1e-3");
    }
    std::printf("ddp_check ok: fp16, %d ranks, %d steps, max difference %.3g of the largest "
                "parameter\n", world, kSteps, rel);
    return 0;
  }
  const double diff = MaxRelDiff(p, q);
  if (!(diff <= 1e-6)) return Fail(mode + ": max relative difference " + std::to_string(diff));
  if (counting != nullptr) {
    const size_t params = kSteps * model->parameters().size();
    if (counting->steps != kSteps || counting->params != params) {
      return Fail("hook: saw " + std::to_string(counting->steps) + " steps and " +
                  std::to_string(counting->params) + " parameters' gradients, expected " +
                  std::to_string(kSteps) + " and " + std::to_string(params));
    }
  }
  std::printf("ddp_check ok: %s, %d ranks, %d steps, max relative difference %.3g\n", mode.c_str(),
              world, kSteps, diff);
  return 0;
}

}  // namespace

int DdpCheckMain(int argc, char** argv) {
  std::string mode = "adam", out = ".";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
  }
  try {
    if (mode.rfind("twin-", 0) == 0) return RunTwin(mode, out);
    return Run(mode);
  } catch (const std::exception& e) {
    std::string what = e.what();
    return Fail(what.substr(0, what.find('\n')));
  }
}
