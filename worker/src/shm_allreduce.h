// A sum-allreduce of float32/float64 buffers between the ranks of one machine through a shared-memory
// segment: no sockets, no copies through the kernel. DistributedDataParallel uses it instead of
// Gloo's TCP allreduce when every rank of the job is on this host (see ddp.cc). No LibTorch here.
//
// Protocol, per piece of at most `slot_bytes`: every rank copies its piece into its own
// slot; barrier; rank r sums the r-th 1/world of the piece over all slots (in rank order, so
// every rank gets bit-identical results) into the result area; barrier; every rank copies the
// result out. Two sets of slots and result areas alternate between pieces, so two barriers per
// piece suffice. Barriers spin briefly, then sleep on a futex in the segment.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "text.h"

namespace dlrun::worker {

class ShmAllreduce {
 public:
  // Collective: every rank calls it with the same name, world and slot size. `barrier` is a
  // barrier over the same ranks (e.g. the process group's). Rank 0 creates the segment, the
  // others open it, and rank 0 removes its name once all have mapped it (it lives until the
  // last rank unmaps it, so nothing is left in /dev/shm even after a crash).
  static lite::StatusOr<std::unique_ptr<ShmAllreduce>> Create(
      const std::string& name, int rank, int world, int64_t slot_bytes,
      const std::function<void()>& barrier, std::chrono::milliseconds timeout);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // data[0..n) = the sum over ranks of their data[0..n). Every rank must call it with the same
  // n, in the same order. Fails (and poisons the segment for the others) after `timeout`
  // without the other ranks.
  lite::Status Sum(float* data, int64_t n) { return SumT(data, n); }
  lite::Status Sum(double* data, int64_t n) { return SumT(data, n); }

 private:
  struct Header;
  ShmAllreduce() = default;
  lite::Status Barrier();
  template <typename T>
  lite::Status SumT(T* data, int64_t n);
  char* Slot(int set, int rank) const;

  Header* header_ = nullptr;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int rank_ = 0;
  int world_ = 1;
  int64_t slot_bytes_ = 0;
  uint64_t piece_ = 0;  // pieces done, selects the buffer set
  std::chrono::milliseconds timeout_{0};
};

}  // namespace dlrun::worker
