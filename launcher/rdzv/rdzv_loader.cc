#include "launcher/rdzv/rdzv_loader.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "launcher/base/self_path.h"

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
  const std::string self = SelfPath();
  const size_t slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
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
