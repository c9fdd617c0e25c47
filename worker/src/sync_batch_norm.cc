#include "dlrun/sync_batch_norm.h"

#include <torch/torch.h>

#include <stdexcept>

#include "group.h"
#include "text.h"

namespace dlrun::worker {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A sum over the ranks that autograd can differentiate: every rank's output depends on every
// rank's input, so the gradient of each input is the sum of all ranks' output gradients.
struct AllreduceSum : torch::autograd::Function<AllreduceSum> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               c10d::ProcessGroup* pg) {
    ctx->saved_data["pg"] = reinterpret_cast<int64_t>(pg);
    std::vector<torch::Tensor> t{x.clone()};
    detail::WaitWork(pg->allreduce(t));
    return t[0];
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* pg = reinterpret_cast<c10d::ProcessGroup*>(ctx->saved_data["pg"].toInt());
    std::vector<torch::Tensor> t{grads[0].contiguous().clone()};
    detail::WaitWork(pg->allreduce(t));
    return {t[0], torch::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_,
                                     c10::intrusive_ptr<c10d::ProcessGroup> pg_)
    : options(options_), pg(std::move(pg_)) {
  if (!pg) throw std::invalid_argument("SyncBatchNorm: the process group is null");
  reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "dlrun::worker::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=" << options.momentum().value_or(-1) << ", ranks=" << pg->getSize() << ")";
}

int use_group(torch::nn::Module& module, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  if (!pg) throw std::invalid_argument("use_group: the process group is null");
  int moved = 0;
  module.apply([&](torch::nn::Module& m) {  // the module and every one below it
    if (auto* bn = dynamic_cast<SyncBatchNormImpl*>(&m)) bn->pg = pg, ++moved;
  });
  return moved;
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  const int64_t c = options.num_features();
  if (input.dim() < 2 || input.size(1) != c) {
    throw std::invalid_argument(lite::StrCat("SyncBatchNorm: input of shape ",
                                             c10::str(input.sizes()), ", expected [N, ", c,
                                             ", ...]"));
  }
  const bool use_batch = is_training() || !options.track_running_stats();
  if (!use_batch || pg->getSize() == 1) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, use_batch,
                             options.momentum().value_or(0.1), options.eps(), false);
  }
  // This rank's count, mean and (biased) variance per channel, two-pass for accuracy, gathered
  // into row `rank` of a [world, 2C+1] table that one differentiable allreduce fills.
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  std::vector<int64_t> channel_shape(input.dim(), 1);
  channel_shape[1] = c;
  const double n_local = static_cast<double>(input.numel() / c);
  torch::Tensor mean_local = input.mean(dims);
  torch::Tensor var_local = (input - mean_local.view(channel_shape)).pow(2).mean(dims);
  torch::Tensor row = torch::cat({mean_local, var_local, torch::full({1}, n_local, input.options())});
  const int world = pg->getSize(), rank = pg->getRank();
  std::vector<torch::Tensor> rows;
  for (int r = 0; r < world; ++r) rows.push_back(r == rank ? row : torch::zeros_like(row));
  torch::Tensor table = AllreduceSum::apply(torch::stack(rows), pg.get());
  torch::Tensor means = table.narrow(1, 0, c), vars = table.narrow(1, c, c);
  torch::Tensor counts = table.narrow(1, 2 * c, 1);  // [world, 1]
  torch::Tensor total = counts.sum();
  // The parallel variance formula: the global mean, and the within- plus between-rank spread.
  torch::Tensor mean = (means * counts).sum(0) / total;
  torch::Tensor var = ((vars + (means - mean).pow(2)) * counts).sum(0) / total;
  torch::Tensor out = (input - mean.view(channel_shape)) * torch::rsqrt(var + options.eps()).view(channel_shape);
  if (options.affine()) out = out * weight.view(channel_shape) + bias.view(channel_shape);
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    const double n = total.item<double>();
    num_batches_tracked += 1;
    const double momentum = options.momentum().has_value()
                                ? *options.momentum()
                                : 1.0 / num_batches_tracked.item<double>();  // cumulative average
    running_mean.mul_(1 - momentum).add_(mean.detach() * momentum);
    running_var.mul_(1 - momentum).add_(var.detach() * (n / std::max(n - 1, 1.0)) * momentum);
  }
  return out;
}

}  // namespace dlrun::worker
