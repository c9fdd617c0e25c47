#include "launcher/rdzv/rdzv_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <string>

#include "absl/strings/str_cat.h"

// Defined when the rendezvous is linked into dlrun (DLRUN_PORTABLE: the wheel); null otherwise.
extern "C" dlrun::rdzv::Api* dlrun_rdzv_api() __attribute__((weak));

namespace dlrun::launcher {

absl::StatusOr<rdzv::Api*> LoadRendezvous() {
  static rdzv::Api* api = nullptr;
  if (api != nullptr) return api;
  if (dlrun_rdzv_api != nullptr) {
    api = dlrun_rdzv_api();
    return api;
  }
  char exe[PATH_MAX] = {0};
  std::string dir = ".";
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    dir = std::string(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
  }
  std::string errors;
  for (const std::string& path : {dir + "/../lib/libdlrun_rdzv.so", dir + "/libdlrun_rdzv.so",
                                  std::string("libdlrun_rdzv.so")}) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
      continue;
    }
    auto get = reinterpret_cast<rdzv::Api* (*)()>(dlsym(h, "dlrun_rdzv_api"));
    if (get == nullptr) return absl::InternalError(absl::StrCat(path, ": no dlrun_rdzv_api"));
    api = get();
    return api;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot load the rendezvous library libdlrun_rdzv.so: ", errors));
}

}  // namespace dlrun::launcher
