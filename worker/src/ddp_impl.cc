// DDP's state and its work (ddp_impl.h): the gradient buckets, their readiness hooks and launch
// in a fixed order, their reduction (Gloo's allreduce, the shared-memory path of shm_reducer.h,
// or a communication hook), the agreement on the hook, and join()'s side of a rank out of data.
#include "ddp_impl.h"

#include <ATen/core/ivalue.h>
#include <cxxabi.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <utility>

#include "common/contract.h"
#include "dlrun/agent_link.h"
#include "dlrun/nvtx_ranges.h"

namespace dlrun::worker {

DistributedDataParallelBase::Impl::~Impl() {
  Unhook();
  shm.reset();  // its thread ends before the buckets it sums go
}

void DistributedDataParallelBase::Impl::BuildBuckets(
    const std::vector<std::vector<size_t>>& layout) {
  std::vector<torch::Tensor> old_views(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) old_views[i] = slots[i].view;
  buckets.clear();
  info.clear();
  for (size_t b = 0; b < layout.size(); ++b) {
    Bucket bucket;
    BucketInfo bi;
    int64_t numel = 0;
    for (size_t i : layout[b]) numel += slots[i].param.numel();
    bucket.flat = torch::zeros({numel}, slots[layout[b][0]].param.options());
    int64_t off = 0;
    for (size_t i : layout[b]) {
      Slot& s = slots[i];
      s.bucket = b;
      s.offset = off;
      // Shares the bucket's storage without being an autograd view: LibTorch's
      // Optimizer::zero_grad() calls detach_() on every grad, which a view refuses.
      s.view = torch::empty({0}, bucket.flat.options());
      s.view.set_(bucket.flat.storage(), off, s.param.sizes(), s.param.contiguous().strides());
      off += s.param.numel();
      bucket.slots.push_back(i);
      bi.parameters.push_back(s.name);
    }
    bi.numel = numel;
    bi.bytes = numel * bucket.flat.element_size();
    buckets.push_back(std::move(bucket));
    info.push_back(std::move(bi));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!old_views[i].defined()) continue;
    Slot& s = slots[i];
    s.view.copy_(old_views[i]);
    const torch::Tensor g = s.param.grad();
    if (g.defined() && g.is_alias_of(old_views[i])) s.param.mutable_grad() = s.view;
  }
}

namespace {

// `o` as a permutation of 0..n-1, or the error every rank must build the same model.
std::vector<size_t> CheckedOrder(const torch::Tensor& order, int64_t src) {
  const size_t n = static_cast<size_t>(order.numel());
  auto o = order.accessor<int64_t, 1>();
  std::vector<size_t> agreed(n);
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = o[i];
    if (k < 0 || static_cast<size_t>(k) >= n || seen[k]) {
      throw std::runtime_error(lite::StrCat(
          "DistributedDataParallel: rank ", src, "'s gradient order names parameter index ", k,
          " of ", n, " twice or out of range; every rank must build the same model"));
    }
    seen[k] = true;
    agreed[i] = static_cast<size_t>(k);
  }
  return agreed;
}

torch::Tensor OrderTensor(const std::vector<size_t>& order, size_t n) {
  torch::Tensor t = torch::zeros({static_cast<int64_t>(n)}, torch::kLong);
  auto o = t.accessor<int64_t, 1>();
  for (size_t i = 0; i < order.size() && i < n; ++i) o[i] = static_cast<int64_t>(order[i]);
  return t;
}

}  // namespace

void DistributedDataParallelBase::Impl::RebuildInReadyOrder() {
  const size_t n = slots.size();
  if (ready_order.size() != n) return;
  torch::Tensor order = OrderTensor(ready_order, n);
  if (pg->getSize() > 1) {
    std::vector<torch::Tensor> t{order};
    detail::WaitWork(pg->broadcast(t));
  }
  ready_order = CheckedOrder(order, 0);
  BuildBuckets(assign_buckets_in_ready_order(SlotBytes(), ready_order,
                                             CapBytes(options.first_bucket_cap_mb),
                                             CapBytes(options.bucket_cap_mb)));
}

std::vector<size_t> DistributedDataParallelBase::Impl::AgreeOnReadyOrder(size_t n) {
  const std::vector<size_t>& mine = options.ready_order;
  const bool has = mine.size() == n && n > 0;
  if (pg->getSize() == 1) return has ? CheckedOrder(OrderTensor(mine, n), 0) : mine;
  std::vector<torch::Tensor> who{
      torch::full({1}, has ? pg->getRank() : pg->getSize(), torch::kLong)};
  c10d::AllreduceOptions lowest;
  lowest.reduceOp = c10d::ReduceOp::MIN;
  detail::WaitWork(pg->allreduce(who, lowest));
  const int64_t src = who[0].item<int64_t>();
  if (src >= pg->getSize()) return {};  // no rank has one: PyTorch's order, then the rebuild
  std::vector<torch::Tensor> order{OrderTensor(has ? mine : std::vector<size_t>{}, n)};
  c10d::BroadcastOptions from;
  from.rootRank = src;
  detail::WaitWork(pg->broadcast(order, from));
  return CheckedOrder(order[0], src);
}

std::vector<int64_t> DistributedDataParallelBase::Impl::SlotBytes() const {
  std::vector<int64_t> sizes;
  for (const Slot& s : slots) sizes.push_back(s.param.numel() * s.param.element_size());
  return sizes;
}

void DistributedDataParallelBase::Impl::Hook(size_t i) {
  auto& installed = torch::autograd::impl::post_acc_grad_hooks(slots[i].param);
  installed = std::make_unique<ReadyHook>(self, i, std::move(installed));
}

void DistributedDataParallelBase::Impl::Unhook() {
  for (Slot& s : slots) {
    auto& installed = torch::autograd::impl::post_acc_grad_hooks(s.param);
    auto* ours = dynamic_cast<ReadyHook*>(installed.get());
    if (ours != nullptr && ours->impl.expired()) installed = std::move(ours->previous);
  }
}

void DistributedDataParallelBase::Impl::StartIteration() {
  for (Slot& s : slots) {
    s.ready = false;
    s.fired = 0;
  }
  for (Bucket& b : buckets) {
    b.pending = b.slots.size();
    b.work.reset();
    b.hook_done.reset();
    b.launched = false;
  }
  next_launch = 0;
  callback_queued = false;
  if (shm) shm->NewIteration();
}

void DistributedDataParallelBase::Impl::Gather(Slot& s) {
  torch::Tensor g = s.param.grad();
  if (!g.defined()) {
    s.view.zero_();
  } else if (!g.is_alias_of(s.view)) {
    s.view.copy_(g);
  }
}

c10d::GradBucket DistributedDataParallelBase::Impl::MakeGradBucket(size_t idx) {
  const Bucket& b = buckets[idx];
  std::vector<size_t> offsets, lengths;
  std::vector<c10::IntArrayRef> sizes;
  std::vector<torch::Tensor> params;
  for (size_t i : b.slots) {
    offsets.push_back(static_cast<size_t>(slots[i].offset));
    lengths.push_back(static_cast<size_t>(slots[i].param.numel()));
    sizes.push_back(slots[i].param.sizes());
    params.push_back(slots[i].param);
  }
  return c10d::GradBucket(idx, buckets.size(), b.flat, std::move(offsets), std::move(lengths),
                          std::move(sizes), std::move(params), std::nullopt);
}

void DistributedDataParallelBase::Impl::LaunchReady() {
  // Collectives must be issued in the same order on every rank: launch bucket k only after
  // buckets 0..k-1.
  while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
    const size_t idx = next_launch++;
    Bucket& b = buckets[idx];
    b.launched = true;
    b.range = start_range("allreduce bucket", static_cast<int64_t>(idx));
    if (hook) {
      c10d::GradBucket grad_bucket = MakeGradBucket(idx);
      b.hook_done = hook->runHook(grad_bucket);
      continue;
    }
    if (shm) {
      shm->Enqueue(b.flat, std::exchange(b.range, 0));
      continue;
    }
    std::vector<torch::Tensor> t{b.flat};
    b.work = pg->allreduce(t);
  }
}

void DistributedDataParallelBase::Impl::OnGradReady(size_t i) {
  // In-process recovery: the rest of this backward would be thrown away (a thrown hook ends it).
  detail::ThrowIfPeerLost();
  std::lock_guard<std::mutex> lock(mu);
  if (forward_no_sync.value_or(no_sync)) {
    if (!local_backward_queued) {  // this backward stays local; the next forward decides anew
      local_backward_queued = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] {
        std::lock_guard<std::mutex> l(mu);
        local_backward_queued = false;
        forward_no_sync.reset();
      });
    }
    return;
  }
  Slot& s = slots[i];
  if (!callback_queued) {
    callback_queued = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { Finalize(); });
    if (graph_recorded) {
      // static_graph: the parameters the first step found unused are ready from the start.
      for (Slot& u : slots) {
        if (u.expected == 0) MarkReady(u);
      }
      LaunchReady();
    }
  }
  if (options.static_graph) {
    if (s.fired++ == 0 && !rebuilt) ready_order.push_back(i);
    // The first step reduces after backward (it is still counting); later ones as soon as
    // every accumulation the first step saw has arrived.
    if (!graph_recorded || s.fired < s.expected || s.ready) return;
    MarkReady(s);
    LaunchReady();
    return;
  }
  if (s.ready) return;
  if (!rebuilt) ready_order.push_back(i);
  MarkReady(s);
  LaunchReady();
}

void DistributedDataParallelBase::Impl::MarkReady(Slot& s) {
  s.ready = true;
  Gather(s);
  --buckets[s.bucket].pending;
}

void DistributedDataParallelBase::Impl::SetUpSharedMemory() {
  bool want = options.shared_memory_allreduce && !hook;
  if (const char* v = std::getenv(contract::kDdpShm); v != nullptr && std::string(v) == "0") {
    want = false;
  }
  const char* lws = std::getenv(contract::kLocalWorldSize);
  if (lws == nullptr || std::atoi(lws) != pg->getSize()) want = false;
  std::vector<torch::Tensor> flats;
  for (const Bucket& b : buckets) flats.push_back(b.flat);
  shm = ShmReducer::Agree(pg, flats, want);
}

void DistributedDataParallelBase::Impl::Finalize() {
  const auto backward_done = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu);
  forward_no_sync.reset();
  std::vector<std::string> missing;
  const bool recording = options.static_graph && !graph_recorded;
  for (Slot& s : slots) {
    if (recording) s.expected = s.fired;
    if (s.ready) continue;
    if (!options.find_unused_parameters && !recording) {
      missing.push_back(s.name);
      continue;
    }
    if (!rebuilt && s.fired == 0) ready_order.push_back(static_cast<size_t>(&s - slots.data()));
    MarkReady(s);  // no gradient this time: contributes zeros (or what was accumulated)
  }
  if (recording) graph_recorded = true;
  if (!missing.empty()) {
    if (missing.size() > 8) {
      missing.resize(8);
      missing.push_back("...");
    }
    throw std::runtime_error(
        lite::StrCat("DistributedDataParallel: parameter(s) ", lite::StrJoin(missing, ", "),
                     " got no gradient in this backward; construct DistributedDataParallel with "
                     "find_unused_parameters = true if parts of the model are unused"));
  }
  LaunchReady();
  AwaitBuckets();
  if (forward_at != std::chrono::steady_clock::time_point{}) {
    const auto synced = std::chrono::steady_clock::now();
    last_timing.compute_s = std::chrono::duration<double>(backward_done - forward_at).count();
    last_timing.sync_s =
        broadcast_s + std::chrono::duration<double>(synced - backward_done).count();
    forward_at = {};
  }
  EndStep();
}

void DistributedDataParallelBase::Impl::AwaitBuckets() {
  const double scale = 1.0 / pg->getSize();
  if (shm && !hook) shm->AwaitSummed(buckets.size());
  for (Bucket& b : buckets) {
    if (b.hook_done) {
      detail::WaitFuture(b.hook_done);  // PeerLost at the agent's word
      const torch::Tensor mean = hook->parseHookResult(b.hook_done->value());  // throws its error
      if (!mean.is_same(b.flat)) b.flat.copy_(mean.view_as(b.flat));
      end_range(std::exchange(b.range, 0));
      continue;
    }
    if (b.work) detail::WaitWork(b.work);
    b.flat.mul_(scale);
    end_range(std::exchange(b.range, 0));
  }
  // A hook of the trainer's own may have dropped its all-reduce's error (a lost peer): with the
  // agent's word heard, its sums may miss the peer, so the step is given up.
  if (hook) detail::ThrowIfPeerLost();
}

void DistributedDataParallelBase::Impl::EndStep() {
  torch::NoGradGuard no_grad;
  for (Slot& s : slots) {
    torch::Tensor g = s.param.grad();
    if (options.gradient_as_bucket_view || !g.defined()) {
      if (!g.defined() || !g.is_alias_of(s.view)) s.param.mutable_grad() = s.view;
    } else {
      g.copy_(s.view);
    }
  }
  if (!rebuilt) {
    if (options.rebuild_buckets_in_ready_order) {
      RebuildInReadyOrder();  // keeps the agreed order (ready_order())
    } else {
      ready_order.clear();
    }
    rebuilt = true;
  }
  StartIteration();
  heartbeat();  // one reduced backward = one step of progress for the agent's hang check
}

void DistributedDataParallelBase::Impl::AgreeOnHook() {
  hook_agreed = true;
  if (pg->getSize() < 2) return;
  std::string mine = "none";
  if (hook) {
    const c10d::CommHookInterface& h = *hook;
    if (const auto* cast = dynamic_cast<const CastAllreduceHook*>(hook.get())) {
      mine = cast->Name();
    } else {  // a hook of the trainer's own: its type, readable
      int status = 0;
      char* readable = abi::__cxa_demangle(typeid(h).name(), nullptr, nullptr, &status);
      mine = status == 0 && readable != nullptr ? readable : typeid(h).name();
      std::free(readable);
    }
  }
  const double fingerprint =
      static_cast<double>(std::hash<std::string>{}(mine) % (uint64_t{1} << 52));
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < pg->getSize(); ++r) all[0].push_back(torch::empty({1}, torch::kDouble));
  std::vector<torch::Tensor> in{torch::full({1}, fingerprint, torch::kDouble)};
  detail::WaitWork(pg->allgather(all, in));
  std::vector<std::string> differ;
  for (int r = 1; r < pg->getSize(); ++r) {
    if (all[0][r].item<double>() != all[0][0].item<double>()) differ.push_back(lite::StrCat(r));
  }
  if (!differ.empty()) {
    throw std::runtime_error(lite::StrCat(
        "DistributedDataParallel: the communication hook differs across ranks: rank(s) ",
        lite::StrJoin(differ, ","), " have another one than rank 0 (rank ", pg->getRank(), " has ",
        hook ? lite::StrCat("a ", mine) : std::string("none"),
        "); every rank must register the same hook (register_comm_hook) before its first forward"));
  }
}

// join() (DistributedDataParallelBase::JoinGuard): a rank out of data answers the collectives
// the others still run, as PyTorch's Join context manager does for DDP.

torch::Tensor DistributedDataParallelBase::Impl::Flag(int64_t v) const {
  return torch::full(
      {1}, v,
      torch::TensorOptions()
          .dtype(torch::kLong)
          .device(slots.empty() ? torch::Device(torch::kCPU) : slots[0].param.device()));
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
  c10d::broadcast_coalesced(pg, state, 250 * 1024 * 1024,
                            static_cast<int>(root[0].item<int64_t>()));
}

}  // namespace dlrun::worker
