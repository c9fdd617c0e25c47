// ddp_check: run under `dlrun --nproc-per-node 2`; checks dlrun::worker::DistributedDataParallel
// against a single-process reference computed on every rank. Exit 0 and "ddp_check ok" on
// success, 1 with the reason otherwise.
//   ddp_check --mode adam|nosync|buffers-on|buffers-off|unused-error|unused-ok|reload|reorder|fp16
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <sstream>

#include "dlrun/ddp.h"
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

int Run(const std::string& mode) {
  auto ctx = dlrun::worker::init();
  const int rank = ctx.rank(), world = ctx.worldSize();
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
  if (rank == 0) std::printf("%s\n", ddp.bucketReport().c_str());
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
        auto guard = ddp.noSync();
        ddp.prepareForward();
        torch::mse_loss(model->forward(mine(0, x)), mine(0, y)).backward();
      }
      ddp.prepareForward();
      torch::mse_loss(model->forward(mine(1, x)), mine(1, y)).backward();
    } else if (mode.rfind("unused", 0) == 0) {
      ddp.prepareForward();
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
    if (mode == "nosync") {
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
    ddp.prepareForward();
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
    std::printf("after training: %s\n", ddp.bucketReport().c_str());
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
    if (ddp.bucketReport().find("fp16-compressed") == std::string::npos) {
      return Fail("fp16: the report does not say fp16-compressed: " + ddp.bucketReport());
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
  std::printf("ddp_check ok: %s, %d ranks, %d steps, max relative difference %.3g\n", mode.c_str(),
              world, kSteps, diff);
  return 0;
}

}  // namespace

int DdpCheckMain(int argc, char** argv) {
  std::string mode = "adam";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
  }
  try {
    return Run(mode);
  } catch (const std::exception& e) {
    std::string what = e.what();
    return Fail(what.substr(0, what.find('\n')));
  }
}
