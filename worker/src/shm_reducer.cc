// The shared-memory path's communication thread (shm_reducer.h).
#include "shm_reducer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "dlrun/nvtx_ranges.h"
#include "group.h"

namespace dlrun::worker {

std::unique_ptr<ShmReducer> ShmReducer::Agree(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                              const std::vector<at::Tensor>& flats, bool wants) {
  const int world = pg->getSize();
  if (world < 2) return nullptr;
  int64_t max_bytes = 0;
  for (const at::Tensor& flat : flats) {
    // Every rank places the model alike, so this return is the same everywhere: GPU
    // gradients (NCCL, which also refuses the CPU tensors of the agreement below) never
    // take this path.
    if (!flat.device().is_cpu()) return nullptr;
    const auto t = flat.scalar_type();
    if (t != at::kFloat && t != at::kDouble) wants = false;
    max_bytes = std::max<int64_t>(max_bytes, flat.numel() * flat.element_size());
  }
  // Everyone agrees, and learns rank 0's pid and instance count for a segment name unique on
  // this host (a process that replaced a lost rank has made fewer engines than the others).
  static std::atomic<int> instances{0};
  const int instance = instances++;
  const bool zero = pg->getRank() == 0;
  std::vector<at::Tensor> t{
      at::tensor({static_cast<int64_t>(wants ? 1 : 0), static_cast<int64_t>(zero ? getpid() : 0),
                  static_cast<int64_t>(zero ? instance : 0)})};
  detail::WaitWork(pg->allreduce(t));
  if (t[0][0].item<int64_t>() != world) return nullptr;
  const std::string name =
      lite::StrCat("/dlrun-ddp-", t[0][1].item<int64_t>(), "-", t[0][2].item<int64_t>());
  auto created = ShmAllreduce::Create(
      name, pg->getRank(), world,
      // Pieces as large as 32 MiB of segment allow (2 sets of world + 1 areas).
      std::max<int64_t>(4096, std::min<int64_t>(max_bytes, (32 << 20) / (2 * (world + 1)))),
      [pg] { detail::WaitWork(pg->barrier()); }, std::chrono::minutes(5));
  std::vector<at::Tensor> ok{at::tensor({static_cast<int64_t>(created.ok() ? 1 : 0)})};
  detail::WaitWork(pg->allreduce(ok));
  if (ok[0].item<int64_t>() != world) {
    if (!created.ok()) {
      std::fprintf(stderr, "dlrun::worker DDP: %s; using Gloo's allreduce\n",
                   std::string(created.status().message()).c_str());
    }
    return nullptr;
  }
  return std::make_unique<ShmReducer>(std::move(*created));
}

ShmReducer::ShmReducer(std::unique_ptr<ShmAllreduce> shm)
    : shm_(std::move(shm)), thread_([this] { Loop(); }) {}

ShmReducer::~ShmReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ShmReducer::Enqueue(at::Tensor flat, uint64_t range) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(flat), range);
  }
  cv_.notify_all();
}

void ShmReducer::NewIteration() {
  std::lock_guard<std::mutex> lock(mu_);
  summed_ = 0;
}

void ShmReducer::AwaitSummed(size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return summed_ >= n; });
  if (!status_.ok()) throw std::runtime_error(std::string(status_.message()));
}

void ShmReducer::Loop() {
  for (;;) {
    std::pair<at::Tensor, uint64_t> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    at::Tensor& flat = item.first;
    lite::Status st = flat.scalar_type() == at::kDouble
                          ? shm_->Sum(flat.data_ptr<double>(), flat.numel())
                          : shm_->Sum(flat.data_ptr<float>(), flat.numel());
    end_range(item.second);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.ok() && status_.ok()) status_ = st;
      ++summed_;
    }
    cv_.notify_all();
  }
}

}  // namespace dlrun::worker
