#include "dlrun/ddp.h"
#include "common/contract.h"
#include "dlrun/agent_link.h"
#include "dlrun/ranges.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/torch.h>

#include <ATen/core/ivalue.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

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
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    torch::Tensor buffer = bucket.getBufferRef();
    torch::Tensor sent = wire_ ? buffer.to(*wire_) : buffer;
    sent.div_(state_->getSize());
    std::vector<torch::Tensor> t{sent};
    auto done = state_->allreduce(t)->getFuture();
    return done->then(
        [buffer, sent](c10::ivalue::Future&) -> c10::IValue {
          if (!sent.is_same(buffer)) buffer.copy_(sent);
          return buffer;
        },
        c10::TensorType::get());
  }

 private:
  std::optional<c10::ScalarType> wire_;
};

}  // namespace

namespace comm_hooks {
std::unique_ptr<c10d::CommHookInterface> Allreduce(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_unique<CastAllreduceHook>(std::move(pg), std::nullopt);
}
std::unique_ptr<c10d::CommHookInterface> Fp16Compress(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_unique<CastAllreduceHook>(std::move(pg), torch::kHalf);
}
std::unique_ptr<c10d::CommHookInterface> Bf16Compress(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_unique<CastAllreduceHook>(std::move(pg), torch::kBFloat16);
}
}  // namespace comm_hooks

std::vector<std::vector<size_t>> AssignBuckets(const std::vector<int64_t>& sizes_bytes,
                                               int64_t first_cap_bytes, int64_t cap_bytes) {
  // Cut in registration order, then reversed: the last-defined parameters are ready first.
  std::vector<size_t> order(sizes_bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto buckets = CutBuckets(sizes_bytes, order, first_cap_bytes, cap_bytes);
  std::reverse(buckets.begin(), buckets.end());
  return buckets;
}

std::vector<std::vector<size_t>> AssignBucketsInReadyOrder(const std::vector<int64_t>& sizes_bytes,
                                                           const std::vector<size_t>& ready_order,
                                                           int64_t first_cap_bytes,
                                                           int64_t cap_bytes) {
  return CutBuckets(sizes_bytes, ready_order, first_cap_bytes, cap_bytes);
}

struct DistributedDataParallelBase::Impl {
  struct Slot {
    std::string name;
    torch::Tensor param;
    size_t bucket = 0;
    int64_t offset = 0;
    torch::Tensor view;  // this parameter's part of the bucket, shaped like the parameter
    bool ready = false;
    int fired = 0;     // static_graph: gradient accumulations seen in this step
    int expected = 0;  // static_graph: accumulations per step, recorded in the first step
  };
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> slots;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;                // the built-in allreduce
    c10::intrusive_ptr<c10::ivalue::Future> hook_done;  // a communication hook's
    bool launched = false;
    uint64_t range = 0;  // its NVTX "allreduce bucket" range, from launch to reduced
  };

  std::weak_ptr<Impl> self;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  DDPOptions options;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::vector<BucketInfo> info;
  std::vector<torch::Tensor> buffers;
  std::mutex mu;  // hooks of different parameters may run on different autograd threads
  bool no_sync = false;
  // The step's split for telemetry (guarded by mu): when forward began (after the buffer
  // broadcast), how long that broadcast waited, and the last reduced step's figures.
  std::chrono::steady_clock::time_point forward_at{};
  double broadcast_s = 0;
  DistributedDataParallelBase::StepTiming last_timing;
  bool callback_queued = false;
  size_t next_launch = 0;
  bool rebuilt = false;             // buckets re-packed in ready order (after the first step)
  std::vector<size_t> ready_order;  // slots as their gradients arrived, until then
  std::unique_ptr<c10d::CommHookInterface> hook;  // replaces the allreduce when set
  bool graph_recorded = false;  // static_graph: the first step's record is in the slots
  bool join_active = false;     // inside a JoinGuard

  // The shared-memory path: a communication thread sums launched buckets in launch order (the
  // same order on every rank), so reduction still overlaps the rest of backward.
  std::unique_ptr<ShmAllreduce> shm;
  std::thread comm_thread;
  std::mutex comm_mu;
  std::condition_variable comm_cv;
  std::deque<size_t> comm_queue;
  size_t comm_done = 0;  // buckets reduced in this iteration
  lite::Status comm_status;
  bool comm_stop = false;

  ~Impl() {
    Unhook();
    if (comm_thread.joinable()) {
      {
        std::lock_guard<std::mutex> lock(comm_mu);
        comm_stop = true;
      }
      comm_cv.notify_all();
      comm_thread.join();
    }
  }

  void CommLoop() {
    for (;;) {
      size_t idx = 0;
      {
        std::unique_lock<std::mutex> lock(comm_mu);
        comm_cv.wait(lock, [&] { return comm_stop || !comm_queue.empty(); });
        if (comm_stop) return;
        idx = comm_queue.front();
        comm_queue.pop_front();
      }
      torch::Tensor& flat = buckets[idx].flat;
      lite::Status st = flat.scalar_type() == torch::kDouble
                            ? shm->Sum(flat.data_ptr<double>(), flat.numel())
                            : shm->Sum(flat.data_ptr<float>(), flat.numel());
      endRange(std::exchange(buckets[idx].range, 0));
      {
        std::lock_guard<std::mutex> lock(comm_mu);
        if (!st.ok() && comm_status.ok()) comm_status = st;
        ++comm_done;
      }
      comm_cv.notify_all();
    }
  }

  // (Re)creates the buckets: `layout` lists each bucket's slots in their order within it. Values
  // the old views held (the gradients just reduced, at a rebuild) move to the new views.
  void BuildBuckets(const std::vector<std::vector<size_t>>& layout) {
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

  // Once, after the first reduced backward: the buckets in the order rank 0 saw gradients
  // arrive (every rank must use the same buckets, and ranks may see different orders).
  void RebuildInReadyOrder() {
    const size_t n = slots.size();
    if (ready_order.size() != n) return;
    torch::Tensor order = torch::empty({static_cast<int64_t>(n)}, torch::kLong);
    auto o = order.accessor<int64_t, 1>();
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<int64_t>(ready_order[i]);
    if (pg->getSize() > 1) {
      std::vector<torch::Tensor> t{order};
      pg->broadcast(t)->wait();
    }
    std::vector<size_t> agreed(n);
    std::vector<bool> seen(n, false);
    for (size_t i = 0; i < n; ++i) {
      const int64_t k = o[i];
      if (k < 0 || static_cast<size_t>(k) >= n || seen[k]) {
        throw std::runtime_error(lite::StrCat(
            "DistributedDataParallel: rank 0's gradient order names parameter index ", k,
            " of ", n, " twice or out of range; every rank must build the same model"));
      }
      seen[k] = true;
      agreed[i] = static_cast<size_t>(k);
    }
    BuildBuckets(AssignBucketsInReadyOrder(SlotBytes(), agreed, CapBytes(options.first_bucket_cap_mb),
                                           CapBytes(options.bucket_cap_mb)));
  }

  std::vector<int64_t> SlotBytes() const {
    std::vector<int64_t> sizes;
    for (const Slot& s : slots) sizes.push_back(s.param.numel() * s.param.element_size());
    return sizes;
  }
  static int64_t CapBytes(double mb) { return static_cast<int64_t>(mb * 1024 * 1024); }

  // The readiness hook sits on the parameter itself (autograd's post-accumulate-grad hook, kept
  // in the tensor's autograd metadata), not on its gradient accumulator: loading a checkpoint
  // with set_() (InputArchive, torch::load) gives a parameter a new accumulator, and a hook on
  // the old one would silently stop firing, so that a trainer calling model->forward() directly
  // would stop averaging. A hook the user had installed is kept and runs first.
  struct ReadyHook : torch::autograd::PostAccumulateGradHook {
    ReadyHook(std::weak_ptr<Impl> impl, size_t slot,
              std::unique_ptr<torch::autograd::PostAccumulateGradHook> previous)
        : impl(std::move(impl)), slot(slot), previous(std::move(previous)) {}
    void operator()(const torch::autograd::Variable& tensor) override {
      if (previous) (*previous)(tensor);
      if (auto m = impl.lock()) m->OnGradReady(slot);
    }
    std::weak_ptr<Impl> impl;
    size_t slot;
    std::unique_ptr<torch::autograd::PostAccumulateGradHook> previous;
  };

  void Hook(size_t i) {
    auto& installed = torch::autograd::impl::post_acc_grad_hooks(slots[i].param);
    installed = std::make_unique<ReadyHook>(self, i, std::move(installed));
  }

  // Gives each parameter back the hook it had before (when ours is still the outermost).
  void Unhook() {
    for (Slot& s : slots) {
      auto& installed = torch::autograd::impl::post_acc_grad_hooks(s.param);
      auto* ours = dynamic_cast<ReadyHook*>(installed.get());
      if (ours != nullptr && ours->impl.expired()) installed = std::move(ours->previous);
    }
  }

  void StartIteration() {
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
    std::lock_guard<std::mutex> lock(comm_mu);
    comm_done = 0;
  }

  // Copies a gradient that is not (any longer) a bucket view into its bucket.
  void Gather(Slot& s) {
    torch::Tensor g = s.param.grad();
    if (!g.defined()) {
      s.view.zero_();
    } else if (!g.is_alias_of(s.view)) {
      s.view.copy_(g);
    }
  }

  // What a communication hook sees of bucket idx (PyTorch's GradBucket).
  c10d::GradBucket MakeGradBucket(size_t idx) {
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

  void LaunchReady() {
    // Collectives must be issued in the same order on every rank: launch bucket k only after
    // buckets 0..k-1.
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      const size_t idx = next_launch++;
      Bucket& b = buckets[idx];
      b.launched = true;
      b.range = startRange("allreduce bucket", static_cast<int64_t>(idx));
      if (hook) {
        c10d::GradBucket grad_bucket = MakeGradBucket(idx);
        b.hook_done = hook->runHook(grad_bucket);
        continue;
      }
      if (shm) {
        {
          std::lock_guard<std::mutex> lock(comm_mu);
          comm_queue.push_back(idx);
        }
        comm_cv.notify_all();
        continue;
      }
      std::vector<torch::Tensor> t{b.flat};
      b.work = pg->allreduce(t);
    }
  }

  void OnGradReady(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (no_sync) return;
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

  void MarkReady(Slot& s) {
    s.ready = true;
    Gather(s);
    --buckets[s.bucket].pending;
  }

  // Collective (every rank decides the same): the shared-memory path when the whole group is on
  // this host, else Gloo.
  void SetUpSharedMemory() {
    const int world = pg->getSize();
    if (world < 2) return;
    bool want = options.shared_memory_allreduce && !hook;
    if (const char* v = std::getenv(contract::kDdpShm); v != nullptr && std::string(v) == "0") {
      want = false;
    }
    const char* lws = std::getenv(contract::kLocalWorldSize);
    if (lws == nullptr || std::atoi(lws) != world) want = false;
    int64_t max_bytes = 0;
    for (const Bucket& b : buckets) {
      // Every rank places the model alike, so this return is the same everywhere: GPU
      // gradients (NCCL, which also refuses the CPU tensors of the agreement below) never
      // take this path.
      if (!b.flat.device().is_cpu()) return;
      const auto t = b.flat.scalar_type();
      if (t != torch::kFloat && t != torch::kDouble) want = false;
      max_bytes = std::max<int64_t>(max_bytes, b.flat.numel() * b.flat.element_size());
    }
    // Everyone agrees, and learns rank 0's pid for a segment name unique on this host.
    static std::atomic<int> instances{0};
    const int instance = instances++;
    std::vector<torch::Tensor> t{torch::tensor(
        {static_cast<int64_t>(want ? 1 : 0), static_cast<int64_t>(pg->getRank() == 0 ? getpid() : 0)})};
    pg->allreduce(t)->wait();
    if (t[0][0].item<int64_t>() != world) return;
    const std::string name = lite::StrCat("/dlrun-ddp-", t[0][1].item<int64_t>(), "-", instance);
    auto created = ShmAllreduce::Create(
        name, pg->getRank(), world,
        // Pieces as large as 32 MiB of segment allow (2 sets of world + 1 areas).
        std::max<int64_t>(4096, std::min<int64_t>(max_bytes, (32 << 20) / (2 * (world + 1)))),
        [this] { pg->barrier()->wait(); }, std::chrono::minutes(5));
    std::vector<torch::Tensor> ok{torch::tensor({static_cast<int64_t>(created.ok() ? 1 : 0)})};
    pg->allreduce(ok)->wait();
    if (ok[0].item<int64_t>() != world) {
      if (!created.ok()) {
        std::fprintf(stderr, "dlrun::worker DDP: %s; using Gloo's allreduce\n",
                     std::string(created.status().message()).c_str());
      }
      return;
    }
    shm = std::move(*created);
    comm_thread = std::thread([this] { CommLoop(); });
  }

  void Finalize() {
    const auto backward_done = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu);
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
      throw std::runtime_error(lite::StrCat(
          "DistributedDataParallel: parameter(s) ", lite::StrJoin(missing, ", "),
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

  // Waits for every launched bucket and leaves the mean in it.
  void AwaitBuckets() {
    const double scale = 1.0 / pg->getSize();
    if (shm && !hook) {
      std::unique_lock<std::mutex> lock(comm_mu);
      comm_cv.wait(lock, [&] { return comm_done == buckets.size(); });
      if (!comm_status.ok()) throw std::runtime_error(std::string(comm_status.message()));
    }
    for (Bucket& b : buckets) {
      if (b.hook_done) {
        b.hook_done->wait();
        const torch::Tensor mean = hook->parseHookResult(b.hook_done->value());  // throws its error
        if (!mean.is_same(b.flat)) b.flat.copy_(mean.view_as(b.flat));
        endRange(std::exchange(b.range, 0));
        continue;
      }
      if (b.work) b.work->wait();
      b.flat.mul_(scale);
      endRange(std::exchange(b.range, 0));
    }
  }

  // The reduced gradients into .grad, the one-time rebuild, and the next step's bookkeeping.
  void EndStep() {
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
      if (options.rebuild_buckets_in_ready_order) RebuildInReadyOrder();
      rebuilt = true;
      ready_order.clear();
    }
    StartIteration();
    heartbeat();  // one reduced backward = one step of progress for the agent's hang check
  }

  // join(): a small int64 tensor where the process group's collectives want it.
  torch::Tensor Flag(int64_t v) const {
    return torch::full({1}, v, torch::TensorOptions().dtype(torch::kLong).device(
                                   slots.empty() ? torch::Device(torch::kCPU) : slots[0].param.device()));
  }

  // The root of the buffer broadcast: 0, or inside join() the highest rank still training
  // (a rank that ran out of data passes -1), as PyTorch's _find_common_rank.
  int BufferRoot(bool training) {
    if (!join_active && training) return 0;
    std::vector<torch::Tensor> t{Flag(training ? pg->getRank() : -1)};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    pg->allreduce(t, max)->wait();
    return static_cast<int>(t[0].item<int64_t>());
  }

  // join(), on a rank out of data: answers the collectives of each step the others still run.
  void ShadowUntilAllJoined() {
    const int world = pg->getSize();
    if (world < 2) return;
    bool last_to_finish = true;
    for (;;) {
      std::vector<torch::Tensor> still{Flag(0)};
      pg->allreduce(still)->wait();
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
    pg->allreduce(root, max)->wait();
    std::vector<torch::Tensor> state;
    for (const Slot& s : slots) state.push_back(s.param);
    if (options.broadcast_buffers) state.insert(state.end(), buffers.begin(), buffers.end());
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(pg, state, 250 * 1024 * 1024, static_cast<int>(root[0].item<int64_t>()));
  }
};

DistributedDataParallelBase::DistributedDataParallelBase(
    std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<c10d::ProcessGroup> pg,
    DDPOptions options)
    : module_(std::move(module)), impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.self = impl_;
  m.pg = std::move(pg);
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
  {
    int64_t sig = static_cast<int64_t>(params.size());
    for (auto& p : params) sig = sig * 1000003 + p.numel();
    std::vector<torch::Tensor> mine{torch::tensor({sig})};
    std::vector<std::vector<torch::Tensor>> all(1);
    for (int r = 0; r < m.pg->getSize(); ++r) all[0].push_back(torch::zeros({1}, torch::kLong));
    m.pg->allgather(all, mine)->wait();
    for (int r = 0; r < m.pg->getSize(); ++r) {
      if (all[0][r].item<int64_t>() != sig) {
        throw std::runtime_error(lite::StrCat(
            "DistributedDataParallel: rank ", r, " has a model with different parameters (count "
            "or shapes) than rank ", m.pg->getRank(), "; every rank must build the same model"));
      }
    }
  }

  // Rank 0's parameters and buffers everywhere.
  for (auto& b : module_->buffers()) m.buffers.push_back(b);
  std::vector<torch::Tensor> state = params;
  state.insert(state.end(), m.buffers.begin(), m.buffers.end());
  if (m.pg->getSize() > 1 && !state.empty()) {
    c10d::broadcast_coalesced(m.pg, state, 250 * 1024 * 1024, 0);
  }

  // Buckets: reverse registration order, within each bucket too (the order gradients arrive in).
  m.slots.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    m.slots[i].name = names[i];
    m.slots[i].param = params[i];
  }
  auto layout = AssignBuckets(m.SlotBytes(), Impl::CapBytes(options.first_bucket_cap_mb),
                              Impl::CapBytes(options.bucket_cap_mb));
  for (auto& bucket : layout) std::reverse(bucket.begin(), bucket.end());
  m.BuildBuckets(layout);
  for (size_t i = 0; i < m.slots.size(); ++i) {
    Impl::Slot& s = m.slots[i];
    if (options.gradient_as_bucket_view) {
      if (s.param.grad().defined()) s.view.copy_(s.param.grad());
      s.param.mutable_grad() = s.view;
    }
    m.Hook(i);
  }
  if (options.fp16_compression) m.hook = comm_hooks::Fp16Compress(m.pg);
  m.StartIteration();
  m.SetUpSharedMemory();
}

void DistributedDataParallelBase::registerCommHook(std::unique_ptr<c10d::CommHookInterface> hook) {
  if (!hook) throw std::invalid_argument("registerCommHook: the hook is null");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->hook && !impl_->options.fp16_compression) {
    throw std::logic_error("registerCommHook: a communication hook is already registered");
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

void DistributedDataParallelBase::prepareForward() {
  Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  if (m.join_active && m.no_sync) {
    // A joined rank answers one buffer broadcast and one reduced backward per forward.
    throw std::logic_error("DistributedDataParallel: noSync() inside join() is not supported");
  }
  if (m.join_active && m.pg->getSize() > 1) {
    // join(): "still training", matched by the flag a joined rank sends each round.
    std::vector<torch::Tensor> still{m.Flag(1)};
    m.pg->allreduce(still)->wait();
  }
  if (m.options.broadcast_buffers && m.pg->getSize() > 1 && !m.buffers.empty()) {
    torch::NoGradGuard no_grad;
    ScopedRange range("broadcast buffers");
    c10d::broadcast_coalesced(m.pg, m.buffers, 250 * 1024 * 1024, m.BufferRoot(true));
  }
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(m.mu);
  m.forward_at = now;
  m.broadcast_s = std::chrono::duration<double>(now - start).count();
}

DistributedDataParallelBase::StepTiming DistributedDataParallelBase::lastStepTiming() const {
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

std::string DistributedDataParallelBase::bucketReport() const {
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
