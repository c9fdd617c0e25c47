// dlrun::worker::DistributedDataParallel: PyTorch's DDP for LibTorch trainers.
//
//   dlrun::worker::DistributedDataParallel ddp(model, ctx.pg);   // broadcasts rank 0's state
//   torch::Tensor loss = torch::mse_loss(ddp(x), y);  // ddp(x): model->forward(x), same type
//   loss.backward();                    // buckets are allreduced while backward runs;
//   optimizer.step();                   // grads are averaged when backward returns
//   {
//     auto guard = ddp.no_sync();        // accumulate locally, no communication
//     torch::mse_loss(ddp(x), y).backward();
//   }
//
// `model` is a module holder (`Net model;` for TORCH_MODULE(Net)) or a std::shared_ptr to the
// module. Calling model->forward(x) directly also averages the gradients, as does any forward:
// the reduction hangs off each parameter (its post-accumulate-grad hook), so it survives
// loading a checkpoint into the model, in place or by set_() as torch::load does. Only the
// buffer broadcast (broadcast_buffers) needs ddp(x), ddp.forward(x) or ddp.prepare_forward().
//
// Gradients are packed into buckets in reverse registration order (the order backward usually
// produces them), re-packed once in the observed order after the first step; each bucket's allreduce starts as soon as its last gradient is ready, buckets start in
// the same order on every rank, and a callback queued on the autograd engine waits for them all
// and averages before backward() returns. The parameters defined first (the last gradients
// computed) share a small bucket of first_bucket_cap_mb, as in PyTorch, so little is left to
// send after backward ends.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/nn/module.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dlrun/sync_batch_norm.h"

namespace dlrun::worker {

struct DDPOptions {
  double bucket_cap_mb = 25;
  double first_bucket_cap_mb = 1;  // PyTorch's _DEFAULT_FIRST_BUCKET_BYTES
  bool broadcast_buffers = true;   // rank 0's buffers (e.g. BatchNorm statistics) before forward
  // Parameters without a gradient in a backward are reduced as zeros. When false, such a
  // parameter is an error that names it (instead of a hang).
  bool find_unused_parameters = false;
  // p.grad() is a view into its bucket (no copy in or out). A trainer that sets grads to
  // undefined between steps still works: the gradient is copied in once and the view restored.
  bool gradient_as_bucket_view = true;
  // When every rank of the process group runs on this machine (LOCAL_WORLD_SIZE ==
  // WORLD_SIZE) and the gradients are float32 or float64 on the CPU, buckets are summed through shared
  // memory on a communication thread instead of Gloo's TCP allreduce. DLRUN_DDP_SHM=0 in the
  // environment turns it off as well.
  bool shared_memory_allreduce = true;
  // After the first reduced backward, re-pack the buckets in the order the gradients actually
  // became ready on rank 0 (PyTorch's _rebuild_buckets), once, so each bucket can start as
  // early as the model allows even when registration order differs from use order.
  bool rebuild_buckets_in_ready_order = true;
  // Registers comm_hooks::fp16_compress (PyTorch's fp16_compress_hook): each bucket is cast to
  // float16, divided by the world size, allreduced (half the bytes on the wire) and copied back
  // into the gradients. float16's range and 11-bit precision apply. For jobs across hosts: it
  // goes through the process group (Gloo or NCCL), so it also turns the shared-memory path off.
  bool fp16_compression = false;
  // PyTorch's static_graph: every step uses the same parameters the same number of times. The
  // first step reduces everything after backward and records which parameters got no gradient
  // and how many times each gradient was accumulated. Later steps count on that record:
  // unused parameters need no find_unused_parameters (they count as ready, reduced as zeros),
  // and a bucket starts once each of its gradients has arrived as many times as recorded.
  bool static_graph = false;
  // PyTorch's init_sync: rank 0's parameters and buffers are broadcast when DDP is built. False
  // where every rank is known to hold the same state already (after an in-process recovery,
  // whose transfer ends with a digest check); the parameter and option check stays. In a
  // generation after the first (a replacement's wrapper, a survivor's rebuilt one) it is false
  // whatever is asked, so a replacement may build its wrapper as the job's first ranks did.
  bool init_sync = true;
  // The bucket order a former wrapper of the same model settled on (its ready_order()), for the
  // wrapper made anew after an in-process recovery: with init_sync false, every rank takes the
  // order of the lowest rank that has one (a replacement has none), and the buckets start in
  // it with no rebuild. The order decides which rank sums which part of a bucket first in
  // Gloo's ring, so the same order keeps a recovered run bit-identical to one without the fault.
  // Ignored with init_sync true; not part of the options every rank must share.
  std::vector<size_t> ready_order;
};

// Communication hooks: what replaces a bucket's allreduce (PyTorch's register_comm_hook, with
// its C++ interface: c10d::CommHookInterface and c10d::GradBucket from
// <torch/csrc/distributed/c10d/comm.hpp>). runHook(bucket) starts the communication of one
// bucket (bucket.getBuffer(): this rank's gradients, flat; getGradients(), getParameters(),
// getIndex(), isLast()) and returns a future; parseHookResult(future's value) must give the
// bucket's gradients averaged over the ranks, which DDP copies into the parameters' .grad.
// Buckets are handed over in the same order on every rank. A hook derived from
// c10d::CppCommHookInterface<State> keeps its state (an error-feedback residual, PowerSGD's
// matrices) between steps:
//
//   struct CountingAllreduce : c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
//     using CppCommHookInterface::CppCommHookInterface;
//     c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
//       ++calls;
//       return dlrun::worker::comm_hooks::allreduce(state_)->runHook(bucket);
//     }
//     int calls = 0;
//   };
//
//   ddp.register_comm_hook(std::make_unique<CountingAllreduce>(ctx.pg));
namespace comm_hooks {
// PyTorch's allreduce_hook: divide by the world size, allreduce (sum).
std::unique_ptr<c10d::CommHookInterface> allreduce(c10::intrusive_ptr<c10d::ProcessGroup> pg);
// PyTorch's fp16_compress_hook and bf16_compress_hook: cast, divide, allreduce, cast back.
std::unique_ptr<c10d::CommHookInterface> fp16_compress(c10::intrusive_ptr<c10d::ProcessGroup> pg);
std::unique_ptr<c10d::CommHookInterface> bf16_compress(c10::intrusive_ptr<c10d::ProcessGroup> pg);
}  // namespace comm_hooks

struct BucketInfo {
  std::vector<std::string> parameters;  // names, in bucket order
  int64_t numel = 0;
  int64_t bytes = 0;
};

// What DistributedDataParallel<Model> does apart from calling the model (and what code that
// takes any wrapped model can hold a reference to).
class DistributedDataParallelBase {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                              c10::intrusive_ptr<c10d::ProcessGroup> pg, DDPOptions options = {});
  ~DistributedDataParallelBase();
  DistributedDataParallelBase(const DistributedDataParallelBase&) = delete;
  DistributedDataParallelBase& operator=(const DistributedDataParallelBase&) = delete;

  // Before a forward (ddp(x) does it): rank 0's buffers to every rank when broadcast_buffers is
  // set, and the start of the step's compute time for last_step_timing().
  void prepare_forward();

  // While the guard lives, backward accumulates gradients locally without communicating; the
  // first backward after it reduces the accumulated sum. As PyTorch's no_sync(), the forward
  // decides: a backward whose forward went through the wrapper (ddp(x), prepare_forward())
  // inside the guard stays local even when the guard ended before backward (the Python habit:
  // only the forward under the guard), and one whose forward came after the guard syncs. After
  // model->forward() called directly, the guard at backward time decides.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallelBase* d);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallelBase* d_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(this); }

  // The last reduced step, for dlrun's telemetry (dlrun::worker::StepReport): compute_s from
  // the start of forward (after the buffer broadcast) to the end of backward, sync_s the time
  // waiting in the buffer broadcast and for the gradient buckets after backward. In synchronous
  // DDP the slowest rank has the longest compute and the shortest sync wait. -1 before the
  // first reduced step.
  struct StepTiming {
    double compute_s = -1;
    double sync_s = -1;
  };
  StepTiming last_step_timing() const;

  // Replaces the allreduce of every bucket with `hook` (see comm_hooks above). Call it once, on
  // every rank, before the first backward; the shared-memory path is then not used.
  void register_comm_hook(std::unique_ptr<c10d::CommHookInterface> hook);

  // PyTorch's join() for uneven inputs: while the guard lives, ranks may run different numbers
  // of steps. Each forward tells the others this rank is still training; when the guard ends on
  // a rank that ran out of data, the rank keeps answering the others' collectives (the buffer
  // broadcast from the highest still-training rank, and every bucket's allreduce with zero
  // gradients) until every rank has ended its guard. Gradients are divided by the whole world
  // size, as PyTorch does by default (divide_by_initial_world_size). Then every rank takes the
  // parameters (and buffers) of the highest rank among the last to finish, as PyTorch does.
  // Use ddp(x) or prepare_forward() for every forward inside the guard, and no no_sync().
  //
  //   {
  //     auto joined = ddp.join();
  //     for (auto& [x, y] : my_uneven_share) {  // ranks may hold different numbers of batches
  //       optimizer.zero_grad();
  //       torch::mse_loss(ddp(x), y).backward();
  //       optimizer.step();
  //     }
  //   }  // returns once every rank is done
  class JoinGuard {
   public:
    explicit JoinGuard(DistributedDataParallelBase* d);
    ~JoinGuard() noexcept(false);
    JoinGuard(const JoinGuard&) = delete;
    JoinGuard& operator=(const JoinGuard&) = delete;

   private:
    DistributedDataParallelBase* d_;
  };
  JoinGuard join() { return JoinGuard(this); }

  // The current buckets, in launch order (after the first step: the observed ready order).
  const std::vector<BucketInfo>& buckets() const;
  // The parameter order the buckets were re-packed in (rank 0's ready order), once they were;
  // else empty. For DDPOptions::ready_order.
  std::vector<size_t> ready_order() const;
  std::string bucket_report() const;  // one line for logs
  const DDPOptions& options() const;  // as constructed
  torch::nn::Module& module() { return *module_; }

 private:
  struct Impl;
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Impl> impl_;
};

// The wrapper a trainer holds: DistributedDataParallel ddp(model, pg) deduces Model from
// `model` (a module holder such as `Net`, or std::shared_ptr<NetImpl>).
template <typename Model>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(Model model, c10::intrusive_ptr<c10d::ProcessGroup> pg,
                          DDPOptions options = {})
      : DistributedDataParallelBase(ModulePtr(model), std::move(pg), options),
        model_(std::move(model)) {}

  // The model's forward, after prepare_forward(); the result is whatever the model returns.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    prepare_forward();
    return model_->forward(std::forward<Args>(args)...);
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  Model& model() { return model_; }

 private:
  template <typename M>
  static std::shared_ptr<torch::nn::Module> ModulePtr(const M& m) {
    if constexpr (requires { m.ptr(); }) {
      return m.ptr();  // a torch::nn::ModuleHolder
    } else {
      return m;  // a std::shared_ptr to a module
    }
  }
  Model model_;
};

template <typename Model>
DistributedDataParallel(Model, c10::intrusive_ptr<c10d::ProcessGroup>)
    -> DistributedDataParallel<Model>;
template <typename Model>
DistributedDataParallel(Model, c10::intrusive_ptr<c10d::ProcessGroup>, DDPOptions)
    -> DistributedDataParallel<Model>;

// After Recovery::run returned Outcome::recovered (`pg` is the new group, every rank holds the
// same state): `ddp` made anew over `pg`, as the Python wrapper's rec.ddp is after a recovery:
// its options, no broadcast of rank 0's values (init_sync off: the state was checked equal), the
// buckets the old wrapper settled on (the same sums as before the fault), the old wrapper let go
// first (its engine is the old group's), every SyncBatchNorm of the model moved onto `pg`
// (use_group, dlrun/sync_batch_norm.h). A communication hook given with register_comm_hook is
// the trainer's to register again on the new wrapper (the first forward checks every rank has
// the same); DDPOptions::fp16_compression carries over.
//
//   if (r.recovered) { dlrun::worker::rebuild_after_recovery(ddp, ctx.pg); step = r.step; }
template <typename Model>
void rebuild_after_recovery(std::unique_ptr<DistributedDataParallel<Model>>& ddp,
                          c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  if (!ddp) throw std::invalid_argument("rebuild_after_recovery: no wrapper to rebuild");
  DDPOptions o = ddp->options();
  o.init_sync = false;
  o.ready_order = ddp->ready_order();
  use_group(ddp->module(), pg);
  Model model = ddp->model();
  ddp.reset();
  ddp = std::make_unique<DistributedDataParallel<Model>>(std::move(model), std::move(pg), o);
}

// The bucket assignment alone (PyTorch's compute_bucket_assignment_by_size followed by DDP's
// reversal): indices into `sizes_bytes` per bucket, buckets in the order gradients are ready.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& sizes_bytes,
                                               int64_t first_cap_bytes, int64_t cap_bytes);

// The rebuild after the first step: `ready_order` (parameter indices as their gradients became
// ready) cut greedily into buckets, the first capped at first_cap_bytes, the rest at cap_bytes.
std::vector<std::vector<size_t>> assign_buckets_in_ready_order(const std::vector<int64_t>& sizes_bytes,
                                                           const std::vector<size_t>& ready_order,
                                                           int64_t first_cap_bytes,
                                                           int64_t cap_bytes);

}  // namespace dlrun::worker
