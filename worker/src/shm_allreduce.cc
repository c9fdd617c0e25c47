#include "shm_allreduce.h"

#include "recovery/agent_word.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "text.h"

namespace dlrun::worker {

struct ShmAllreduce::Header {
  alignas(64) std::atomic<uint32_t> arrived{0};
  alignas(64) std::atomic<uint32_t> generation{0};
  alignas(64) std::atomic<uint32_t> poisoned{0};
};

namespace {

constexpr size_t kHeaderBytes = 256;
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

}  // namespace

lite::StatusOr<std::unique_ptr<ShmAllreduce>> ShmAllreduce::Create(
    const std::string& name, int rank, int world, int64_t slot_bytes,
    const std::function<void()>& barrier, std::chrono::milliseconds timeout) {
  std::unique_ptr<ShmAllreduce> s(new ShmAllreduce());
  s->rank_ = rank;
  s->world_ = world;
  s->slot_bytes_ = (slot_bytes + 63) / 64 * 64;
  s->timeout_ = timeout;
  // Two sets of (world slots + 1 result area).
  s->bytes_ = kHeaderBytes + 2 * static_cast<size_t>(world + 1) * s->slot_bytes_;
  int fd = -1;
  lite::Status status;
  if (rank == 0) {
    shm_unlink(name.c_str());  // a stale segment of a crashed process with this name
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    // posix_fallocate, not just ftruncate: a full /dev/shm (64 MiB in a default Docker
    // container) is an error here, not a SIGBUS at the first write.
    if (fd >= 0) {
      if (int err = posix_fallocate(fd, 0, static_cast<off_t>(s->bytes_)); err != 0) {
        status = lite::ResourceExhaustedError(lite::StrCat(
            "cannot allocate ", s->bytes_, " bytes of shared memory for ", name, ": ",
            std::strerror(err)));
      }
    }
  }
  barrier();  // rank 0 has created it
  if (rank != 0) fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && status.ok()) {
    status = lite::InternalError(
        lite::StrCat("shm_open ", name, " (rank ", rank, "): ", std::strerror(errno)));
  }
  if (status.ok()) {
    s->base_ = mmap(nullptr, s->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->base_ == MAP_FAILED) {
      s->base_ = nullptr;
      status = lite::InternalError(lite::StrCat("mmap of ", name, ": ", std::strerror(errno)));
    }
  }
  if (fd >= 0) close(fd);
  if (s->base_ != nullptr) {
    s->header_ = static_cast<Header*>(s->base_);
    if (rank == 0) new (s->header_) Header();
  }
  barrier();  // everyone has mapped it (or failed)
  if (rank == 0) shm_unlink(name.c_str());
  if (!status.ok()) return status;
  return s;
}

ShmAllreduce::~ShmAllreduce() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

char* ShmAllreduce::Slot(int set, int rank) const {
  return static_cast<char*>(base_) + kHeaderBytes +
         (static_cast<int64_t>(set) * (world_ + 1) + rank) * slot_bytes_;
}

lite::Status ShmAllreduce::Barrier() {
  Header& h = *header_;
  const uint32_t gen = h.generation.load(std::memory_order_acquire);
  if (h.arrived.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(world_ - 1)) {
    h.arrived.store(0, std::memory_order_relaxed);
    h.generation.fetch_add(1, std::memory_order_acq_rel);
    Futex(&h.generation, FUTEX_WAKE, INT32_MAX, nullptr);
    return lite::OkStatus();
  }
  for (int i = 0; i < 200; ++i) {
    if (h.generation.load(std::memory_order_acquire) != gen) return lite::OkStatus();
    __builtin_ia32_pause();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const timespec slice{0, 10 * 1000 * 1000};  // the agent's word within 10 ms
  while (h.generation.load(std::memory_order_acquire) == gen) {
    if (h.poisoned.load(std::memory_order_acquire) != 0) {
      return lite::AbortedError("another local rank gave up on the shared-memory allreduce");
    }
    if (detail::PeerLossAnnounced()) {  // in-process recovery: a rank of this group is gone
      h.poisoned.store(1, std::memory_order_release);
      Futex(&h.generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return lite::AbortedError("shared-memory allreduce given up: the dlrun agent said a peer "
                                "was lost");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      h.poisoned.store(1, std::memory_order_release);
      Futex(&h.generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return lite::DeadlineExceededError(lite::StrCat(
          "shared-memory allreduce: rank ", rank_, " waited ",
          std::chrono::duration_cast<std::chrono::seconds>(timeout_).count(),
          " s for the other local ranks (did one of them die or stop calling backward?)"));
    }
    Futex(&h.generation, FUTEX_WAIT, gen, &slice);
  }
  return lite::OkStatus();
}

template <typename T>
lite::Status ShmAllreduce::SumT(T* data, int64_t n) {
  const int64_t piece = slot_bytes_ / static_cast<int64_t>(sizeof(T));
  for (int64_t off = 0; off < n; off += piece) {
    const int64_t m = std::min(piece, n - off);
    const int set = static_cast<int>(piece_++ & 1);
    auto slot = [&](int r) { return reinterpret_cast<T*>(Slot(set, r)); };
    std::memcpy(slot(rank_), data + off, m * sizeof(T));
    if (lite::Status s = Barrier(); !s.ok()) return s;
    // The result area is the set's last slot.
    const int64_t lo = m * rank_ / world_, hi = m * (rank_ + 1) / world_;
    T* out = slot(world_);
    std::memcpy(out + lo, slot(0) + lo, (hi - lo) * sizeof(T));
    for (int r = 1; r < world_; ++r) {
      const T* in = slot(r);
      for (int64_t i = lo; i < hi; ++i) out[i] += in[i];
    }
    if (lite::Status s = Barrier(); !s.ok()) return s;
    std::memcpy(data + off, out, m * sizeof(T));
  }
  return lite::OkStatus();
}

template lite::Status ShmAllreduce::SumT<float>(float*, int64_t);
template lite::Status ShmAllreduce::SumT<double>(double*, int64_t);

}  // namespace dlrun::worker
