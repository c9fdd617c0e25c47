#include "launcher/detect/pmix_query.h"

#include "absl/strings/str_cat.h"

#if DLRUN_HAVE_PMIX
#include <dlfcn.h>
#include <pmix.h>

#include <cstdlib>
#include <cstring>
#endif

namespace dlrun::launcher {

#if !DLRUN_HAVE_PMIX

absl::StatusOr<PmixJob> QueryPmixServer() {
  return absl::UnimplementedError(
      "PMIX_NAMESPACE is set but this dlrun was built without the PMIx headers (libpmix-dev): "
      "rebuild with them, or unset PMIX_NAMESPACE and pass --nnodes, --node-rank and the "
      "rendezvous flags");
}

#else

namespace {

// The few libpmix entry points dlrun calls, resolved once from libpmix.so.2.
struct PmixApi {
  decltype(&PMIx_Init) init = nullptr;
  decltype(&PMIx_Get) get = nullptr;
  decltype(&PMIx_Finalize) finalize = nullptr;
  decltype(&PMIx_Error_string) error_string = nullptr;
  decltype(&PMIx_Value_destruct) value_destruct = nullptr;
};

absl::StatusOr<PmixApi> LoadPmix() {
  // Never closed: libpmix starts threads, and unloading under them is not safe.
  void* lib = dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PMIX_NAMESPACE is set but the PMIx client library could not be loaded (", dlerror(),
        "): install libpmix2, or unset PMIX_NAMESPACE and pass --nnodes, --node-rank and the "
        "rendezvous flags"));
  }
  PmixApi api;
  const auto sym = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
    return *fn != nullptr;
  };
  if (!sym("PMIx_Init", &api.init) || !sym("PMIx_Get", &api.get) ||
      !sym("PMIx_Finalize", &api.finalize) || !sym("PMIx_Error_string", &api.error_string) ||
      !sym("PMIx_Value_destruct", &api.value_destruct)) {
    return absl::FailedPreconditionError(
        "libpmix.so.2 lacks PMIx_Init, PMIx_Get, PMIx_Finalize, PMIx_Error_string or "
        "PMIx_Value_destruct: a PMIx v3 or newer client library is needed");
  }
  return api;
}

std::optional<uint32_t> AsUint32(const pmix_value_t& v) {
  int64_t x = -1;
  switch (v.type) {
    case PMIX_UINT8: x = v.data.uint8; break;
    case PMIX_UINT16: x = v.data.uint16; break;
    case PMIX_UINT32: x = v.data.uint32; break;
    case PMIX_UINT64: x = v.data.uint64 > UINT32_MAX ? -1 : static_cast<int64_t>(v.data.uint64); break;
    case PMIX_SIZE: x = v.data.size > UINT32_MAX ? -1 : static_cast<int64_t>(v.data.size); break;
    case PMIX_PROC_RANK: x = v.data.rank; break;
    case PMIX_INT: x = v.data.integer; break;
    case PMIX_INT16: x = v.data.int16; break;
    case PMIX_INT32: x = v.data.int32; break;
    default: break;
  }
  if (x < 0 || x > UINT32_MAX) return std::nullopt;
  return static_cast<uint32_t>(x);
}

class Client {
 public:
  explicit Client(const PmixApi& api) : api_(api) {
    std::memset(&timeout_, 0, sizeof(timeout_));
    std::strncpy(timeout_.key, PMIX_TIMEOUT, PMIX_MAX_KEYLEN);
    timeout_.value.type = PMIX_INT;
    timeout_.value.data.integer = 10;  // seconds, for a key the local server must ask about
  }
  ~Client() {
    if (up_) api_.finalize(nullptr, 0);
  }

  absl::Status Init(pmix_proc_t* me) {
    const pmix_status_t rc = api_.init(me, nullptr, 0);
    if (rc != PMIX_SUCCESS) {
      return absl::UnavailableError(absl::StrCat(
          "PMIX_NAMESPACE is set but PMIx_Init failed (", api_.error_string(rc),
          "): the PMIx server of the launcher is unreachable; unset PMIX_NAMESPACE and pass "
          "--nnodes, --node-rank and the rendezvous flags to run without it"));
    }
    up_ = true;
    return absl::OkStatus();
  }

  // The value of `key` for `proc`, handed to `take`; false when the server has none.
  template <typename Take>
  bool Get(const pmix_proc_t& proc, const char* key, Take take) {
    pmix_value_t* v = nullptr;
    if (api_.get(&proc, key, &timeout_, 1, &v) != PMIX_SUCCESS || v == nullptr) return false;
    take(*v);
    api_.value_destruct(v);
    std::free(v);
    return true;
  }
  std::optional<uint32_t> Uint(const pmix_proc_t& proc, const char* key) {
    std::optional<uint32_t> out;
    Get(proc, key, [&](const pmix_value_t& v) { out = AsUint32(v); });
    return out;
  }
  std::string String(const pmix_proc_t& proc, const char* key) {
    std::string out;
    Get(proc, key, [&](const pmix_value_t& v) {
      if (v.type == PMIX_STRING && v.data.string != nullptr) out = v.data.string;
    });
    return out;
  }

 private:
  const PmixApi& api_;
  pmix_info_t timeout_;
  bool up_ = false;
};

}  // namespace

absl::StatusOr<PmixJob> QueryPmixServer() {
  static const absl::StatusOr<PmixApi> api = LoadPmix();
  if (!api.ok()) return api.status();
  Client client(*api);
  pmix_proc_t me;
  std::memset(&me, 0, sizeof(me));
  if (absl::Status s = client.Init(&me); !s.ok()) return s;
  PmixJob job;
  job.nspace.assign(me.nspace, strnlen(me.nspace, PMIX_MAX_NSLEN));
  job.rank = me.rank;
  pmix_proc_t wildcard = me;
  wildcard.rank = PMIX_RANK_WILDCARD;
  pmix_proc_t rank0 = me;
  rank0.rank = 0;
  job.job_size = client.Uint(wildcard, PMIX_JOB_SIZE);
  job.num_nodes = client.Uint(wildcard, PMIX_NUM_NODES);
  job.local_size = client.Uint(wildcard, PMIX_LOCAL_SIZE);
  job.node_list = client.String(wildcard, PMIX_NODE_LIST);
  job.rank0_host = client.String(rank0, PMIX_HOSTNAME);
  return job;
}

#endif

}  // namespace dlrun::launcher
