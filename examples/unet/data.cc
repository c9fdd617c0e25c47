#include "unet/data.h"

#include <hdf5.h>
#include <torch/torch.h>

#include <array>
#include <random>

#include "absl/strings/str_cat.h"

namespace dlrun::examples {
namespace {

// HDF5's C library keeps global state and Debian builds it without thread safety.
std::mutex& H5Mutex() {
  static std::mutex m;
  return m;
}

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

class H5File {
 public:
  explicit H5File(hid_t id) : id_(id) {}
  ~H5File() {
    std::lock_guard<std::mutex> lock(H5Mutex());
    if (id_ >= 0) H5Fclose(id_);
  }
  hid_t id() const { return id_; }

 private:
  hid_t id_;
};

absl::Status BadFile(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "data file ", path, ": ", why,
      " (expected float datasets Nbody [4, L, L, L] and Hydro [5, L, L, L])"));
}

class H5CropSource final : public CropSource {
 public:
  H5CropSource(std::string path, hid_t file, int64_t box, int64_t size, bool in_memory)
      : path_(std::move(path)), file_(file) {
    box_ = box;
    size_ = size;
    if (in_memory) {
      nbody_ = ReadBlock("Nbody", 4, 0, 0, 0, box);
      hydro_ = ReadBlock("Hydro", 5, 0, 0, 0, box);
    }
  }

  Sample Crop(int64_t z, int64_t y, int64_t x) override {
    if (nbody_.defined()) {
      auto cut = [&](const torch::Tensor& t) {
        return t.narrow(1, z, size_).narrow(2, y, size_).narrow(3, x, size_).clone();
      };
      return {cut(nbody_), cut(hydro_)};
    }
    return {ReadBlock("Nbody", 4, z, y, x, size_), ReadBlock("Hydro", 5, z, y, x, size_)};
  }

 private:
  torch::Tensor ReadBlock(const char* name, int64_t channels, int64_t z, int64_t y, int64_t x,
                          int64_t n) {
    torch::Tensor out = torch::empty({channels, n, n, n}, torch::kFloat32);
    std::lock_guard<std::mutex> lock(H5Mutex());
    hid_t ds = H5Dopen2(file_.id(), name, H5P_DEFAULT);
    hid_t space = H5Dget_space(ds);
    hsize_t start[4] = {0, static_cast<hsize_t>(z), static_cast<hsize_t>(y),
                        static_cast<hsize_t>(x)};
    hsize_t count[4] = {static_cast<hsize_t>(channels), static_cast<hsize_t>(n),
                        static_cast<hsize_t>(n), static_cast<hsize_t>(n)};
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t mem = H5Screate_simple(4, count, nullptr);
    const herr_t rc = H5Dread(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, out.data_ptr());
    H5Sclose(mem);
    H5Sclose(space);
    H5Dclose(ds);
    if (rc < 0) throw std::runtime_error(absl::StrCat("data file ", path_, ": cannot read ", name));
    return out;
  }

  std::string path_;
  H5File file_;
  torch::Tensor nbody_, hydro_;
};

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

namespace {

// Checks both datasets; returns the cube edge. Call with the HDF5 mutex held.
absl::StatusOr<int64_t> ValidateLocked(const std::string& path, hid_t f) {
  int64_t box = -1;
  for (auto [name, channels] : {std::pair<const char*, int64_t>{"Nbody", 4}, {"Hydro", 5}}) {
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) return BadFile(path, absl::StrCat("no dataset ", name));
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t space = H5Dget_space(ds);
    hid_t type = H5Dget_type(ds);
    const bool is_float = H5Tget_class(type) == H5T_FLOAT;
    hsize_t dims[8] = {0};
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank > 0 && rank <= 8) H5Sget_simple_extent_dims(space, dims, nullptr);
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(ds);
    if (!is_float) return BadFile(path, absl::StrCat(name, " is not a float dataset"));
    std::string shape = "[";
    for (int i = 0; i < rank; ++i) absl::StrAppend(&shape, i ? ", " : "", dims[i]);
    shape += "]";
    if (rank != 4 || static_cast<int64_t>(dims[0]) != channels || dims[1] != dims[2] ||
        dims[2] != dims[3]) {
      return BadFile(path, absl::StrCat(name, " has shape ", shape));
    }
    if (box >= 0 && static_cast<int64_t>(dims[1]) != box) {
      return BadFile(path, absl::StrCat("Hydro's cube edge ", dims[1], " differs from Nbody's ", box));
    }
    box = static_cast<int64_t>(dims[1]);
  }
  return box;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CropSource>> CropSource::Open(const std::string& path,
                                                             int64_t data_size, bool in_memory) {
  hid_t f = -1;
  absl::StatusOr<int64_t> box;
  {
    std::lock_guard<std::mutex> lock(H5Mutex());
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our messages instead of HDF5's stack dumps
    if (H5Fis_hdf5(path.c_str()) <= 0) return BadFile(path, "missing or not an HDF5 file");
    f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return BadFile(path, "cannot open");
    box = ValidateLocked(path, f);
    if (box.ok() && data_size > *box) {
      box = absl::InvalidArgumentError(absl::StrCat(
          "--data-size ", data_size, " is larger than the box of ", path, " (", *box,
          "^3): expected a crop of at most ", *box));
    }
    if (!box.ok()) {
      H5Fclose(f);
      return box.status();
    }
  }
  return std::unique_ptr<CropSource>(new H5CropSource(path, f, *box, data_size, in_memory));
}

absl::Status WriteSyntheticFile(const std::string& path, int64_t box, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor nbody = torch::randn({4, box, box, box});
  // Smooth a little so crops have structure, then a fixed per-voxel mix as the target.
  nbody = torch::avg_pool3d(nbody.unsqueeze(0), 3, 1, 1).squeeze(0) * 2;
  torch::Tensor mix = torch::randn({5, 4}) * 0.5;
  torch::Tensor hydro = torch::tanh(torch::einsum("oi,idhw->odhw", {mix, nbody})).contiguous();
  nbody = nbody.contiguous();
  std::lock_guard<std::mutex> lock(H5Mutex());
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  for (auto [name, t] : {std::pair<const char*, torch::Tensor>{"Nbody", nbody}, {"Hydro", hydro}}) {
    hsize_t dims[4];
    for (int i = 0; i < 4; ++i) dims[i] = static_cast<hsize_t>(t.size(i));
    hid_t space = H5Screate_simple(4, dims, nullptr);
    hid_t ds = H5Dcreate2(f, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const herr_t rc = H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr());
    H5Dclose(ds);
    H5Sclose(space);
    if (rc < 0) {
      H5Fclose(f);
      return absl::InternalError(absl::StrCat("cannot write ", name, " to ", path));
    }
  }
  H5Fclose(f);
  return absl::OkStatus();
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
