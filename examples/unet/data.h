// The SC22 U-Net's data: HDF5 files with datasets "Nbody" (4 x L^3) and "Hydro" (5 x L^3),
// random crops of data_size^3 with one of the 24 rotations of the cube applied to input and
// target alike; loaded on worker threads into a prefetch queue.
#pragma once

#include <torch/types.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/src/text.h"

namespace dlrun::examples {

// The k-th (0..23) proper rotation of the cube, applied to the last three dimensions of `t`
// (e.g. [C, D, H, W]): a permutation of the axes plus flips, with determinant +1.
torch::Tensor Rotate24(const torch::Tensor& t, int k);

// Rotate24 of each sample i of a batch [N, C, D, H, W] by rotations[i], on the batch's device
// (the augmentation after the upload).
torch::Tensor RotateBatch(const torch::Tensor& batch, const std::vector<int>& rotations);

struct Sample {
  torch::Tensor input;   // [4, S, S, S]
  torch::Tensor target;  // [5, S, S, S]
  int rotation = 0;      // the one to apply (0: identity) when the loader did not
};

// A batch [n, C, S, S, S] of input and target, and the rotations still to apply to it.
struct HostBatch {
  torch::Tensor input, target;
  std::vector<int> rotations;  // empty: rotated already (or not to rotate)
};

// Random crops from one HDF5 file. "inmem" reads both datasets once; "lowmem" reads each crop
// from the file (HDF5 calls are serialised: Debian's libhdf5 is not thread-safe).
class CropSource {
 public:
  // Validates the file: both datasets present, float, 4-D with 4 and 5 channels, the same cube
  // edge, and data_size no larger than it. Errors name the file and what was expected.
  static lite::StatusOr<std::unique_ptr<CropSource>> Open(const std::string& path,
                                                          int64_t data_size, bool in_memory);
  virtual ~CropSource() = default;
  // A crop at (z, y, x), un-rotated.
  virtual Sample Crop(int64_t z, int64_t y, int64_t x) = 0;
  int64_t box() const { return box_; }
  int64_t size() const { return size_; }

 protected:
  int64_t box_ = 0, size_ = 0;
};

// Writes a valid data file: Nbody random fields and Hydro = tanh of a fixed per-voxel mix of
// them (learnable), edge `box`.
lite::Status WriteSyntheticFile(const std::string& path, int64_t box, uint64_t seed);

// num_workers threads fill a window of prefetch_factor x num_workers random crops, each with a
// random rotation of the 24: applied on the threads, or (rotate_in_loader false) left to the
// caller with RotateBatch after the upload. Sample i of the stream is drawn from its own seed
// (SampleSeed(seed, i)) and handed out in order, so the stream is the same whatever the thread
// count, and a stream opened at `start` (a resume: the samples the steps before it took) goes
// on exactly as the uninterrupted one.
uint64_t SampleSeed(uint64_t seed, int64_t index);
class Prefetcher {
 public:
  Prefetcher(std::shared_ptr<CropSource> source, int num_workers, int prefetch_factor,
             uint64_t seed, bool rotate_in_loader = true, int64_t start = 0);
  ~Prefetcher();
  // A batch [n, C, S, S, S] of input and target.
  std::pair<torch::Tensor, torch::Tensor> Next(int64_t n);
  // The same, with the rotations left to apply (rotate_in_loader false).
  HostBatch NextBatch(int64_t n);

 private:
  void Work();
  Sample Draw(int64_t index) const;
  std::shared_ptr<CropSource> source_;
  int64_t capacity_;
  uint64_t seed_;
  bool rotate_in_loader_;
  std::mutex mu_;
  std::condition_variable ready_cv_, room_cv_;
  std::map<int64_t, Sample> ready_;  // drawn, by index, not yet taken
  int64_t next_draw_, next_take_;    // the next index a thread draws, and the caller takes
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace dlrun::examples
