#include "dlrun/ddp.h"
#include "ddp_impl.h"
#include "common/contract.h"
#include "dlrun/agent_link.h"
#include "dlrun/nvtx_ranges.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/torch.h>

#include <ATen/core/ivalue.h>
#include <cxxabi.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "recovery/agent_word.h"
#include "group.h"
#include "text.h"
#include "shm_allreduce.h"

namespace dlrun::worker {

namespace {

// `order` cut into buckets: the first capped at first_cap, later ones at cap; a bucket closes
// once it reaches its cap (so one parameter larger than the cap gets a bucket of its own).
std::vector<std::vector<size_t>> CutBuckets(const std::vector<int64_t>& sizes_bytes,
                                            const std::vector<size_t>& order,
                                            int64_t first_cap_bytes, int64_t cap_bytes) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  int64_t current_bytes = 0;
  for (size_t i : order) {
    current.push_back(i);
    current_bytes += sizes_bytes[i];
    const int64_t cap = buckets.empty() ? first_cap_bytes : cap_bytes;
    if (current_bytes >= cap) {
      buckets.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

// 512 B, 1.5 KiB, 24.0 MiB: a small bucket is never shown as 0.
std::string HumanBytes(int64_t bytes) {
  if (bytes < 1024) return lite::StrCat(bytes, " B");
  if (bytes < 1024 * 1024) return lite::StrFormat("%.1f KiB", static_cast<double>(bytes) / 1024);
  return lite::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024 * 1024));
}

// PyTorch's default_hooks: allreduce_hook (no cast) and the two compressions. Each divides by
// the world size before the sum, as PyTorch does (so a float16 sum of means cannot overflow
// where the mean does not), and hands back the bucket's own buffer holding the mean.
class CastAllreduceHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  CastAllreduceHook(c10::intrusive_ptr<c10d::ProcessGroup> pg, std::optional<c10::ScalarType> wire)
      : CppCommHookInterface(std::move(pg)), wire_(wire) {}
  // PyTorch's name of the hook (its default_hooks).
  std::string Name() const {
    if (!wire_) return "allreduce_hook";
    return *wire_ == torch::kHalf ? "fp16_compress_hook" : "bf16_compress_hook";
  }
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    torch::Tensor buffer = bucket.getBufferRef();
    torch::Tensor sent = wire_ ? buffer.to(*wire_) : buffer;
    sent.div_(state_->getSize());
    std::vector<torch::Tensor> t{sent};
    auto done = state_->allreduce(t)->getFuture();
    return done->then(
        [buffer, sent](c10::ivalue::Future& reduced) -> c10::IValue {
          (void)reduced.value();  // the all-reduce's error (a lost peer) is the hook's
          if (!sent.is_same(buffer)) buffer.copy_(sent);
          return buffer;
        },
        c10::TensorType::get());
  }

 private:
  std::optional<c10::ScalarType> wire_;
};

}  // namespace

namespace detail {
namespace {
std::mutex broadcasts_mu;
std::map<const torch::nn::Module*, bool> broadcasts;
}  // namespace
void NoteBufferBroadcast(const torch::nn::Module* module, bool broadcast) {
  std::lock_guard<std::mutex> lock(broadcasts_mu);
  broadcasts[module] = broadcast;
}
std::optional<bool> BroadcastsBuffers(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(broadcasts_mu);
  const auto it = broadcasts.find(module);
  if (it == broadcasts.end()) return std::nullopt;
  return it->second;
}
}  // namespace detail

namespace comm_hooks {
std::unique_ptr<c10d::CommHookInterface> allreduce(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_unique<CastAllreduceHook>(std::move(pg), std::nullopt);
}
std::unique_ptr<c10d::CommHookInterface> fp16_compress(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_unique<CastAllreduceHook>(std::move(pg), torch::kHalf);
}
std::unique_ptr<c10d::CommHookInterface> bf16_compress(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_unique<CastAllreduceHook>(std::move(pg), torch::kBFloat16);
}
}  // namespace comm_hooks

std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& sizes_bytes,
                                               int64_t first_cap_bytes, int64_t cap_bytes) {
  // Cut in registration order, then reversed: the last-defined parameters are ready first.
  std::vector<size_t> order(sizes_bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto buckets = CutBuckets(sizes_bytes, order, first_cap_bytes, cap_bytes);
  std::reverse(buckets.begin(), buckets.end());
  return buckets;
}

std::vector<std::vector<size_t>> assign_buckets_in_ready_order(const std::vector<int64_t>& sizes_bytes,
                                                           const std::vector<size_t>& ready_order,
                                                           int64_t first_cap_bytes,
                                                           int64_t cap_bytes) {
  return CutBuckets(sizes_bytes, ready_order, first_cap_bytes, cap_bytes);
}


// Every rank builds the same DDP: the same parameter count and shapes, and the same
// DDPOptions (differing bucket caps hang the shared-memory path and abort Gloo on a size
// mismatch). One allgather of a few numbers; a difference is the same one-line error on every
// rank, naming the setting and each rank's value.
static void CheckSameEverywhere(c10d::ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                         const DDPOptions& o) {
  uint64_t shapes = params.size();
  for (const auto& p : params) {
    for (int64_t d : p.sizes()) shapes = shapes * 1000003 + static_cast<uint64_t>(d);
  }
  const std::vector<std::pair<const char*, double>> mine = {
      {"the parameters (count or shapes)", static_cast<double>(shapes % (uint64_t{1} << 52))},
      {"bucket_cap_mb", o.bucket_cap_mb},
      {"first_bucket_cap_mb", o.first_bucket_cap_mb},
      {"broadcast_buffers", o.broadcast_buffers},
      {"find_unused_parameters", o.find_unused_parameters},
      {"gradient_as_bucket_view", o.gradient_as_bucket_view},
      {"shared_memory_allreduce", o.shared_memory_allreduce},
      {"rebuild_buckets_in_ready_order", o.rebuild_buckets_in_ready_order},
      {"fp16_compression", o.fp16_compression},
      {"static_graph", o.static_graph},
      {"init_sync", o.init_sync}};
  const int64_t n = static_cast<int64_t>(mine.size());
  torch::Tensor values = torch::empty({n}, torch::kDouble);
  for (int64_t i = 0; i < n; ++i) values[i] = mine[i].second;
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < pg.getSize(); ++r) all[0].push_back(torch::empty({n}, torch::kDouble));
  std::vector<torch::Tensor> in{values};
  detail::WaitWork(pg.allgather(all, in));
  for (int64_t i = 0; i < n; ++i) {
    bool same = true;
    for (int r = 1; r < pg.getSize(); ++r) {
      same &= all[0][r][i].item<double>() == all[0][0][i].item<double>();
    }
    if (same) continue;
    if (i == 0) {
      throw std::runtime_error(
          "DistributedDataParallel: the ranks' models have different parameters (count or "
          "shapes); every rank must build the same model");
    }
    std::vector<std::string> each;
    for (int r = 0; r < pg.getSize(); ++r) {
      each.push_back(lite::StrCat("rank ", r, " has ", all[0][r][i].item<double>()));
    }
    throw std::runtime_error(lite::StrCat("DistributedDataParallel: DDPOptions::", mine[i].first,
                                          " differs across ranks (", lite::StrJoin(each, ", "),
                                          "); every rank must build DDP with the same options"));
  }
}

DistributedDataParallelBase::DistributedDataParallelBase(
    std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<c10d::ProcessGroup> pg,
    DDPOptions options)
    : module_(std::move(module)), impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.self = impl_;
  m.pg = std::move(pg);
  // In a generation after the first (a replacement, a survivor after an in-process recovery),
  // every rank holds the state the recovery's transfer checked equal: no broadcast of rank 0's,
  // and the former wrappers' bucket order, whatever the trainer asked (a replacement's wrapper
  // made as at the job's start meets the survivors' rebuilt ones).
  if (detail::CurrentGeneration() > 0) options.init_sync = false;
  detail::NoteBufferBroadcast(module_.get(), options.broadcast_buffers);
  m.options = options;
  torch::NoGradGuard no_grad;

  // Same parameter shapes everywhere, or a clear error instead of a corrupt reduction.
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (auto& p : module_->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    names.push_back(p.key());
    params.push_back(p.value());
  }
  CheckSameEverywhere(*m.pg, params, options);

  // Rank 0's parameters and buffers everywhere (init_sync).
  for (auto& b : module_->buffers()) m.buffers.push_back(b);
  std::vector<torch::Tensor> state = params;
  state.insert(state.end(), m.buffers.begin(), m.buffers.end());
  if (options.init_sync && m.pg->getSize() > 1 && !state.empty()) {
    c10d::broadcast_coalesced(m.pg, state, 250 * 1024 * 1024, 0);
  }

  // Buckets: reverse registration order, within each bucket too (the order gradients arrive in).
  m.slots.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    m.slots[i].name = names[i];
    m.slots[i].param = params[i];
  }
  // After an in-process recovery: the order the former wrappers settled on, without a rebuild.
  if (!options.init_sync) m.ready_order = m.AgreeOnReadyOrder(m.slots.size());
  m.rebuilt = !m.ready_order.empty();
  std::vector<std::vector<size_t>> layout;
  if (m.rebuilt) {
    layout = assign_buckets_in_ready_order(m.SlotBytes(), m.ready_order,
                                       Impl::CapBytes(options.first_bucket_cap_mb),
                                       Impl::CapBytes(options.bucket_cap_mb));
  } else {
    layout = assign_buckets(m.SlotBytes(), Impl::CapBytes(options.first_bucket_cap_mb),
                           Impl::CapBytes(options.bucket_cap_mb));
    for (auto& bucket : layout) std::reverse(bucket.begin(), bucket.end());
  }
  m.BuildBuckets(layout);
  for (size_t i = 0; i < m.slots.size(); ++i) {
    Impl::Slot& s = m.slots[i];
    if (options.gradient_as_bucket_view) {
      if (s.param.grad().defined()) s.view.copy_(s.param.grad());
      s.param.mutable_grad() = s.view;
    }
    m.Hook(i);
  }
  if (options.fp16_compression) m.hook = comm_hooks::fp16_compress(m.pg);
  m.StartIteration();
  m.SetUpSharedMemory();
}

const DDPOptions& DistributedDataParallelBase::options() const { return impl_->options; }

void DistributedDataParallelBase::register_comm_hook(std::unique_ptr<c10d::CommHookInterface> hook) {
  if (!hook) throw std::invalid_argument("register_comm_hook: the hook is null");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->hook && !impl_->options.fp16_compression) {
    throw std::logic_error("register_comm_hook: a communication hook is already registered");
  }
  impl_->hook = std::move(hook);
}

DistributedDataParallelBase::JoinGuard::JoinGuard(DistributedDataParallelBase* d) : d_(d) {
  std::lock_guard<std::mutex> lock(d_->impl_->mu);
  if (d_->impl_->join_active) throw std::logic_error("join(): this DDP is already joined");
  d_->impl_->join_active = true;
}

DistributedDataParallelBase::JoinGuard::~JoinGuard() noexcept(false) {
  Impl& m = *d_->impl_;
  // Unwinding from an error: the other ranks fail on their own (their collectives time out or
  // see this process gone); answering them here could hang this one.
  if (std::uncaught_exceptions() > 0) {
    m.join_active = false;
    return;
  }
  m.ShadowUntilAllJoined();
  m.join_active = false;
}

DistributedDataParallelBase::~DistributedDataParallelBase() = default;

void DistributedDataParallelBase::prepare_forward() {
  Impl& m = *impl_;
  detail::ThrowIfPeerLost();  // in-process recovery: this step is to be done again anyway
  if (!m.hook_agreed) m.AgreeOnHook();
  const auto start = std::chrono::steady_clock::now();
  if (m.join_active && m.no_sync) {
    // A joined rank answers one buffer broadcast and one reduced backward per forward.
    throw std::logic_error("DistributedDataParallel: no_sync() inside join() is not supported");
  }
  if (m.join_active && m.pg->getSize() > 1) {
    // join(): "still training", matched by the flag a joined rank sends each round.
    std::vector<torch::Tensor> still{m.Flag(1)};
    detail::WaitWork(m.pg->allreduce(still));
  }
  if (m.options.broadcast_buffers && m.pg->getSize() > 1 && !m.buffers.empty()) {
    torch::NoGradGuard no_grad;
    ScopedRange range("broadcast buffers");
    c10d::broadcast_coalesced(m.pg, m.buffers, 250 * 1024 * 1024, m.BufferRoot(true));
  }
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(m.mu);
  m.forward_no_sync = m.no_sync;  // this forward's backward syncs unless the guard is on now
  m.forward_at = now;
  m.broadcast_s = std::chrono::duration<double>(now - start).count();
}

DistributedDataParallelBase::StepTiming DistributedDataParallelBase::last_step_timing() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_timing;
}

DistributedDataParallelBase::NoSyncGuard::NoSyncGuard(DistributedDataParallelBase* d) : d_(d) {
  std::lock_guard<std::mutex> lock(d_->impl_->mu);
  previous_ = d_->impl_->no_sync;
  d_->impl_->no_sync = true;
}

DistributedDataParallelBase::NoSyncGuard::~NoSyncGuard() {
  std::lock_guard<std::mutex> lock(d_->impl_->mu);
  d_->impl_->no_sync = previous_;
}

const std::vector<BucketInfo>& DistributedDataParallelBase::buckets() const { return impl_->info; }

std::vector<size_t> DistributedDataParallelBase::ready_order() const {
  const bool agreed = impl_->rebuilt && impl_->options.rebuild_buckets_in_ready_order;
  return agreed ? impl_->ready_order : std::vector<size_t>{};
}

std::string DistributedDataParallelBase::bucket_report() const {
  std::string backend = "process group";
  try {
    backend = impl_->pg->getBackendName();  // "gloo", "nccl"; not every process group has one
  } catch (const std::exception&) {
  }
  std::vector<std::string> sizes;
  int64_t total = 0;
  for (const BucketInfo& b : impl_->info) {
    sizes.push_back(lite::StrCat(HumanBytes(b.bytes), "/", b.parameters.size(), "p"));
    total += b.bytes;
  }
  return lite::StrCat("DDP: ", impl_->info.size(), " bucket(s), ", HumanBytes(total),
                      " of gradients, in ready order: ", lite::StrJoin(sizes, ", "),
                      "; allreduce: ",
                      impl_->shm && !impl_->hook ? "shared memory (all ranks on this host)" : backend,
                      impl_->options.fp16_compression ? ", fp16-compressed"
                      : impl_->hook                   ? ", through a communication hook"
                                                      : "");
}

}  // namespace dlrun::worker
