#include "unet/data.h"

#include <torch/torch.h>

#include <array>
#include <random>

#include "worker/src/text.h"

namespace dlrun::examples {
namespace {

struct Rotation {
  std::array<int64_t, 3> perm;
  std::array<bool, 3> flip;
};

std::vector<Rotation> MakeRotations() {
  std::vector<Rotation> out;
  std::array<int64_t, 3> p = {0, 1, 2};
  do {
    // The sign of the permutation: count inversions.
    int inv = (p[0] > p[1]) + (p[0] > p[2]) + (p[1] > p[2]);
    for (int mask = 0; mask < 8; ++mask) {
      const int flips = (mask & 1) + ((mask >> 1) & 1) + ((mask >> 2) & 1);
      if ((inv + flips) % 2 == 0) {  // determinant +1: a rotation, not a reflection
        out.push_back({p, {(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0}});
      }
    }
  } while (std::next_permutation(p.begin(), p.end()));
  return out;  // 6 permutations x 4 flip patterns = 24
}

}  // namespace

torch::Tensor Rotate24(const torch::Tensor& t, int k) {
  static const std::vector<Rotation> rotations = MakeRotations();
  const Rotation& r = rotations.at(static_cast<size_t>(k));
  const int64_t d = t.dim();
  std::vector<int64_t> order;
  for (int64_t i = 0; i < d - 3; ++i) order.push_back(i);
  for (int64_t a : r.perm) order.push_back(d - 3 + a);
  torch::Tensor out = t.permute(order);
  std::vector<int64_t> flips;
  for (int i = 0; i < 3; ++i) {
    if (r.flip[i]) flips.push_back(d - 3 + i);
  }
  if (!flips.empty()) out = out.flip(flips);
  return out.contiguous();
}

torch::Tensor RotateBatch(const torch::Tensor& batch, const std::vector<int>& rotations) {
  if (rotations.empty()) return batch;
  std::vector<torch::Tensor> out;
  out.reserve(rotations.size());
  for (size_t i = 0; i < rotations.size(); ++i) {
    out.push_back(Rotate24(batch[static_cast<int64_t>(i)], rotations[i]));
  }
  return torch::stack(out);
}

uint64_t SampleSeed(uint64_t seed, int64_t index) {
  // splitmix64 of the pair: neighbouring indices and seeds give unrelated streams.
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(index) + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Prefetcher::Prefetcher(std::shared_ptr<CropSource> source, int num_workers, int prefetch_factor,
                       uint64_t seed, bool rotate_in_loader, int64_t start)
    : source_(std::move(source)),
      capacity_(static_cast<int64_t>(std::max(1, num_workers)) * std::max(1, prefetch_factor)),
      seed_(seed),
      rotate_in_loader_(rotate_in_loader),
      next_draw_(start),
      next_take_(start) {
  for (int i = 0; i < std::max(1, num_workers); ++i) threads_.emplace_back([this] { Work(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  room_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Sample Prefetcher::Draw(int64_t index) const {
  std::mt19937_64 gen(SampleSeed(seed_, index));
  std::uniform_int_distribution<int64_t> pos(0, source_->box() - source_->size());
  std::uniform_int_distribution<int> rot(0, 23);
  const int64_t z = pos(gen), y = pos(gen), x = pos(gen);
  const int k = rot(gen);
  Sample s = source_->Crop(z, y, x);
  if (rotate_in_loader_) {
    s.input = Rotate24(s.input, k);
    s.target = Rotate24(s.target, k);
  } else {
    s.rotation = k;
  }
  return s;
}

void Prefetcher::Work() {
  for (;;) {
    int64_t index;
    {
      std::unique_lock<std::mutex> l(mu_);
      // At most capacity_ samples ahead of the caller, drawn or being drawn.
      room_cv_.wait(l, [&] { return stop_ || next_draw_ < next_take_ + capacity_; });
      if (stop_) return;
      index = next_draw_++;
    }
    Sample s = Draw(index);
    std::lock_guard<std::mutex> l(mu_);
    ready_.emplace(index, std::move(s));
    ready_cv_.notify_all();
  }
}

std::pair<torch::Tensor, torch::Tensor> Prefetcher::Next(int64_t n) {
  HostBatch b = NextBatch(n);
  return {RotateBatch(b.input, b.rotations), RotateBatch(b.target, b.rotations)};
}

HostBatch Prefetcher::NextBatch(int64_t n) {
  std::vector<torch::Tensor> xs, ys;
  HostBatch b;
  for (int64_t i = 0; i < n; ++i) {
    std::unique_lock<std::mutex> l(mu_);
    ready_cv_.wait(l, [&] { return ready_.count(next_take_) > 0; });
    auto it = ready_.find(next_take_++);
    Sample s = std::move(it->second);
    ready_.erase(it);
    room_cv_.notify_one();
    xs.push_back(std::move(s.input));
    ys.push_back(std::move(s.target));
    if (!rotate_in_loader_) b.rotations.push_back(s.rotation);
  }
  b.input = torch::stack(xs);
  b.target = torch::stack(ys);
  return b;
}

}  // namespace dlrun::examples
