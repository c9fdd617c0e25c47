// DDP's shared-memory path (ddp_impl.h): when the whole group is on one host, a communication
// thread sums the launched gradient buckets through ShmAllreduce (shm_allreduce.h) in launch
// order (the same order on every rank), so the reduction still overlaps the rest of backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "shm_allreduce.h"
#include "text.h"

namespace dlrun::worker {

class ShmReducer {
 public:
  // Collective over `pg` (every rank decides the same): the shared-memory path for buckets
  // `flats` when every rank `wants` it (the whole group on this host, float or double CPU
  // buckets), its segment made; null for Gloo's allreduce (a rank's failure to make the segment
  // is a line on stderr).
  static std::unique_ptr<ShmReducer> Agree(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                           const std::vector<at::Tensor>& flats, bool wants);
  explicit ShmReducer(std::unique_ptr<ShmAllreduce> shm);
  ~ShmReducer();  // stops the thread after the bucket it is summing
  ShmReducer(const ShmReducer&) = delete;
  ShmReducer& operator=(const ShmReducer&) = delete;

  // Sums `flat` (float or double, on the CPU) over the ranks in place, after every bucket queued
  // before it; the NVTX range `range` (0: none) ends when it is summed.
  void Enqueue(at::Tensor flat, uint64_t range);
  // A new iteration: none of its buckets is summed yet.
  void NewIteration();
  // Waits until `n` buckets of this iteration are summed; throws the first failure's line.
  void AwaitSummed(size_t n);

 private:
  void Loop();

  std::unique_ptr<ShmAllreduce> shm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<at::Tensor, uint64_t>> queue_;
  size_t summed_ = 0;  // buckets of this iteration
  lite::Status status_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace dlrun::worker
