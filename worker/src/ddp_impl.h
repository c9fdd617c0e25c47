// The state behind DistributedDataParallelBase (dlrun/ddp.h), internal to the worker library,
// and its work (ddp_impl.cc): the gradient buckets, their readiness hooks, launch in a fixed
// order and reduction (Gloo's, the shared-memory path of shm_reducer.h, or a communication
// hook), and join(). The public methods are in ddp.cc.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "dlrun/ddp.h"
#include "group.h"
#include "shm_reducer.h"
#include "text.h"

namespace dlrun::worker {

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
  // Whether the guard was on at the last forward through the wrapper (prepare_forward), until
  // its backward ends: as in PyTorch, that forward decides whether its backward syncs. A
  // backward after model->forward() called directly goes by the guard at backward time.
  std::optional<bool> forward_no_sync;
  bool local_backward_queued = false;  // a local-only backward's end is queued
  // The step's split for telemetry (guarded by mu): when forward began (after the buffer
  // broadcast), how long that broadcast waited, and the last reduced step's figures.
  std::chrono::steady_clock::time_point forward_at{};
  double broadcast_s = 0;
  DistributedDataParallelBase::StepTiming last_timing;
  bool callback_queued = false;
  size_t next_launch = 0;
  bool rebuilt = false;             // buckets re-packed in ready order (after the first step)
  // Slots as their gradients arrived, until the rebuild; then the order every rank agreed on.
  std::vector<size_t> ready_order;
  std::unique_ptr<c10d::CommHookInterface> hook;  // replaces the allreduce when set
  bool hook_agreed = false;  // AgreeOnHook ran (at the first forward)
  bool graph_recorded = false;  // static_graph: the first step's record is in the slots
  bool join_active = false;     // inside a JoinGuard

  // The shared-memory path (the whole group on this host; SetUpSharedMemory): null for Gloo's.
  std::unique_ptr<ShmReducer> shm;

  ~Impl();

  // (Re)creates the buckets: `layout` lists each bucket's slots in their order within it. Values
  // the old views held (the gradients just reduced, at a rebuild) move to the new views.
  void BuildBuckets(const std::vector<std::vector<size_t>>& layout);

  // Once, after the first reduced backward: the buckets in the order rank 0 saw gradients
  // arrive (every rank must use the same buckets, and ranks may see different orders).
  void RebuildInReadyOrder();
  // DDPOptions::ready_order as every rank agrees on it (init_sync false): the lowest rank's
  // that has one, else empty. Collective.
  std::vector<size_t> AgreeOnReadyOrder(size_t n);
  // Once, at the first forward (register_comm_hook comes after the construction's check): every
  // rank has the same communication hook (its type, and a cast hook's wire type), or each
  // throws one line naming the ranks that differ; a rank reducing through a hook while another
  // waits in the shared-memory sum would hang there (a hook everywhere: LaunchReady takes it
  // before the shared-memory path). Collective.
  void AgreeOnHook();

  std::vector<int64_t> SlotBytes() const;
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

  void Hook(size_t i);

  // Gives each parameter back the hook it had before (when ours is still the outermost).
  void Unhook();

  void StartIteration();

  // Copies a gradient that is not (any longer) a bucket view into its bucket.
  void Gather(Slot& s);

  // What a communication hook sees of bucket idx (PyTorch's GradBucket).
  c10d::GradBucket MakeGradBucket(size_t idx);

  void LaunchReady();

  void OnGradReady(size_t i);

  void MarkReady(Slot& s);

  // Collective (every rank decides the same): the shared-memory path when the whole group is on
  // this host, else Gloo.
  void SetUpSharedMemory();

  void Finalize();

  // Waits for every launched bucket and leaves the mean in it.
  void AwaitBuckets();

  // The reduced gradients into .grad, the one-time rebuild, and the next step's bookkeeping.
  void EndStep();

  // join(): a small int64 tensor where the process group's collectives want it.
  torch::Tensor Flag(int64_t v) const;

  // The root of the buffer broadcast: 0, or inside join() the highest rank still training
  // (a rank that ran out of data passes -1), as PyTorch's _find_common_rank.
  int BufferRoot(bool training);

  // join(), on a rank out of data: answers the collectives of each step the others still run.
  void ShadowUntilAllJoined();
};

}  // namespace dlrun::worker
