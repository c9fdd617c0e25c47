// The U-Net's HDF5 files (CropSource::Open, WriteSyntheticFile): HDF5's C library, optional in
// a build from the wheel (examples/unet/CMakeLists.txt): without it, DLRUN_UNET_NO_HDF5 and both
// say so, and train_unet trains on synthetic data (--synthetic) alone.
#include "unet/data.h"

#ifndef DLRUN_UNET_NO_HDF5
#include <hdf5.h>
#endif
#include <torch/torch.h>

#include <mutex>

#include "worker/src/text.h"

namespace dlrun::examples {
#ifndef DLRUN_UNET_NO_HDF5
namespace {

// HDF5's C library keeps global state and Debian builds it without thread safety.
std::mutex& H5Mutex() {
  static std::mutex m;
  return m;
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

lite::Status BadFile(const std::string& path, const std::string& why) {
  return lite::InvalidArgumentError(
      lite::StrCat("data file ", path, ": ", why,
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
    if (rc < 0) throw std::runtime_error(lite::StrCat("data file ", path_, ": cannot read ", name));
    return out;
  }

  std::string path_;
  H5File file_;
  torch::Tensor nbody_, hydro_;
};

// Checks both datasets; returns the cube edge. Call with the HDF5 mutex held.
lite::StatusOr<int64_t> ValidateLocked(const std::string& path, hid_t f) {
  int64_t box = -1;
  for (auto [name, channels] : {std::pair<const char*, int64_t>{"Nbody", 4}, {"Hydro", 5}}) {
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0)
      return BadFile(path, lite::StrCat("no dataset ", name));
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
    if (!is_float) return BadFile(path, lite::StrCat(name, " is not a float dataset"));
    std::string shape = "[";
    for (int i = 0; i < rank; ++i) lite::StrAppend(&shape, i ? ", " : "", dims[i]);
    shape += "]";
    if (rank != 4 || static_cast<int64_t>(dims[0]) != channels || dims[1] != dims[2] ||
        dims[2] != dims[3]) {
      return BadFile(path, lite::StrCat(name, " has shape ", shape));
    }
    if (box >= 0 && static_cast<int64_t>(dims[1]) != box) {
      return BadFile(path,
                     lite::StrCat("Hydro's cube edge ", dims[1], " differs from Nbody's ", box));
    }
    box = static_cast<int64_t>(dims[1]);
  }
  return box;
}

}  // namespace

lite::StatusOr<std::unique_ptr<CropSource>> CropSource::Open(const std::string& path,
                                                             int64_t data_size, bool in_memory) {
  hid_t f = -1;
  lite::StatusOr<int64_t> box;
  {
    std::lock_guard<std::mutex> lock(H5Mutex());
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our messages instead of HDF5's stack dumps
    if (H5Fis_hdf5(path.c_str()) <= 0) return BadFile(path, "missing or not an HDF5 file");
    f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return BadFile(path, "cannot open");
    box = ValidateLocked(path, f);
    if (box.ok() && data_size > *box) {
      box = lite::InvalidArgumentError(lite::StrCat("--data-size ", data_size,
                                                    " is larger than the box of ", path, " (", *box,
                                                    "^3): expected a crop of at most ", *box));
    }
    if (!box.ok()) {
      H5Fclose(f);
      return box.status();
    }
  }
  return std::unique_ptr<CropSource>(new H5CropSource(path, f, *box, data_size, in_memory));
}

lite::Status WriteSyntheticFile(const std::string& path, int64_t box, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor nbody = torch::randn({4, box, box, box});
  // Smooth a little so crops have structure, then a fixed per-voxel mix as the target.
  nbody = torch::avg_pool3d(nbody.unsqueeze(0), 3, 1, 1).squeeze(0) * 2;
  torch::Tensor mix = torch::randn({5, 4}) * 0.5;
  torch::Tensor hydro = torch::tanh(torch::einsum("oi,idhw->odhw", {mix, nbody})).contiguous();
  nbody = nbody.contiguous();
  std::lock_guard<std::mutex> lock(H5Mutex());
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return lite::InternalError(lite::StrCat("cannot create ", path));
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
      return lite::InternalError(lite::StrCat("cannot write ", name, " to ", path));
    }
  }
  H5Fclose(f);
  return lite::OkStatus();
}
#else

lite::StatusOr<std::unique_ptr<CropSource>> CropSource::Open(const std::string& path, int64_t,
                                                             bool) {
  return lite::FailedPreconditionError(lite::StrCat(
      "data file ", path,
      ": this train_unet was built without HDF5, so it reads no data file; "
      "train on synthetic data (--synthetic), or rebuild where find_package(HDF5) succeeds"));
}

lite::Status WriteSyntheticFile(const std::string& path, int64_t, uint64_t) {
  return lite::FailedPreconditionError(
      lite::StrCat("cannot write ", path, ": this build was made without HDF5"));
}

#endif
}  // namespace dlrun::examples
