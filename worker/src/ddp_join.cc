// join() (DistributedDataParallelBase::JoinGuard): a rank out of data answers the collectives
// the others still run, as PyTorch's Join context manager does for DDP.
#include "ddp_impl.h"

#include <torch/torch.h>

#include <utility>

namespace dlrun::worker {

torch::Tensor DistributedDataParallelBase::Impl::Flag(int64_t v) const {
  return torch::full({1}, v, torch::TensorOptions().dtype(torch::kLong).device(
                                 slots.empty() ? torch::Device(torch::kCPU) : slots[0].param.device()));
}

int DistributedDataParallelBase::Impl::BufferRoot(bool training) {
  if (!join_active && training) return 0;
  std::vector<torch::Tensor> t{Flag(training ? pg->getRank() : -1)};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  detail::WaitWork(pg->allreduce(t, max));
  return static_cast<int>(t[0].item<int64_t>());
}

void DistributedDataParallelBase::Impl::ShadowUntilAllJoined() {
  const int world = pg->getSize();
  if (world < 2) return;
  if (!hook_agreed) AgreeOnHook();  // joined before its first forward: the others' first words
  bool last_to_finish = true;
  for (;;) {
    std::vector<torch::Tensor> still{Flag(0)};
    detail::WaitWork(pg->allreduce(still));
    if (still[0].item<int64_t>() == 0) break;
    last_to_finish = false;
    if (options.broadcast_buffers && !buffers.empty()) {
      torch::NoGradGuard no_grad;
      c10d::broadcast_coalesced(pg, buffers, 250 * 1024 * 1024, BufferRoot(false));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!rebuilt && ready_order.size() != slots.size()) {
      ready_order.clear();  // rank 0's order wins the rebuild; any complete one will do here
      for (size_t i = 0; i < slots.size(); ++i) ready_order.push_back(i);
    }
    for (Slot& s : slots) {
      s.ready = true;
      s.view.zero_();
    }
    for (Bucket& b : buckets) b.pending = 0;
    LaunchReady();
    AwaitBuckets();
    EndStep();
  }
  // Every rank ends with the model of the highest rank among the last to finish (PyTorch's
  // _sync_final_model): the ranks that ran out early stopped stepping.
  std::vector<torch::Tensor> root{Flag(last_to_finish ? pg->getRank() : -1)};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  detail::WaitWork(pg->allreduce(root, max));
  std::vector<torch::Tensor> state;
  for (const Slot& s : slots) state.push_back(s.param);
  if (options.broadcast_buffers) state.insert(state.end(), buffers.begin(), buffers.end());
  torch::NoGradGuard no_grad;
  c10d::broadcast_coalesced(pg, state, 250 * 1024 * 1024, static_cast<int>(root[0].item<int64_t>()));
}

}  // namespace dlrun::worker
