// A small NVTX tool of the tests' own: an injection library (NVTX_INJECTION64_PATH=this .so)
// that writes each range of the "dlrun" domain to $NVTX_RECORD_DIR/<pid>.log, one line per
// event, in the order they happened:
//   push <tid> <name> [<payload>]    pop <tid>    start <id> <name> [<payload>]    end <id>
// Other domains (LibTorch's, if it opens any) are left out. Preloaded (LD_PRELOAD), it also
// stands in for the CUDA runtime's cudaProfilerStart/Stop, which dlrun::worker looks up in the
// process: they write "cudaProfilerStart" / "cudaProfilerStop" lines. NVTX calls InitializeInjectionNvtx2
// once per copy of NVTX in the process; each call installs the same handlers.
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

struct DomainTag {
  int unused;
};
DomainTag g_dlrun;  // the handle of the "dlrun" domain
DomainTag g_other;  // every other domain's

std::mutex g_mu;
int g_fd = -1;
std::atomic<uint64_t> g_next_id{1};

bool Ours(nvtxDomainHandle_t d) { return d == reinterpret_cast<nvtxDomainHandle_t>(&g_dlrun); }

void Write(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Write(const char* fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_fd < 0) {
    const char* dir = std::getenv("NVTX_RECORD_DIR");
    if (dir == nullptr) return;
    char path[512];
    std::snprintf(path, sizeof path, "%s/%d.log", dir, static_cast<int>(getpid()));
    g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_fd < 0) return;
  }
  (void)!write(g_fd, line, static_cast<size_t>(n));
}

// "<name>" or "<name> <payload>".
void Describe(const nvtxEventAttributes_t* a, char* out, size_t size) {
  const char* name =
      a != nullptr && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "?";
  if (a != nullptr && a->payloadType == NVTX_PAYLOAD_TYPE_INT64) {
    std::snprintf(out, size, "%s %lld", name, static_cast<long long>(a->payload.llValue));
  } else {
    std::snprintf(out, size, "%s", name);
  }
}

long Tid() { return syscall(SYS_gettid); }

nvtxDomainHandle_t NVTX_API DomainCreateA(const char* name) {
  return reinterpret_cast<nvtxDomainHandle_t>(std::strcmp(name, "dlrun") == 0 ? &g_dlrun : &g_other);
}

int NVTX_API DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  if (!Ours(d)) return 0;
  char what[160];
  Describe(a, what, sizeof what);
  Write("push %ld %s\n", Tid(), what);
  return 0;
}

int NVTX_API DomainRangePop(nvtxDomainHandle_t d) {
  if (Ours(d)) Write("pop %ld\n", Tid());
  return 0;
}

nvtxRangeId_t NVTX_API DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  if (!Ours(d)) return 0;
  const uint64_t id = g_next_id++;
  char what[160];
  Describe(a, what, sizeof what);
  Write("start %llu %s\n", static_cast<unsigned long long>(id), what);
  return id;
}

void NVTX_API DomainRangeEnd(nvtxDomainHandle_t, nvtxRangeId_t id) {
  if (id != 0) Write("end %llu\n", static_cast<unsigned long long>(id));
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int cudaProfilerStart() {
  Write("cudaProfilerStart\n");
  return 0;
}
extern "C" __attribute__((visibility("default"))) int cudaProfilerStop() {
  Write("cudaProfilerStop\n");
  return 0;
}

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->GetModuleFunctionTable == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr) {
    return 0;
  }
  auto set = [&](unsigned int id, NvtxFunctionPointer f) {
    if (id < size && table[id] != nullptr) *table[id] = f;
  };
  set(NVTX_CBID_CORE2_DomainCreateA, reinterpret_cast<NvtxFunctionPointer>(&DomainCreateA));
  set(NVTX_CBID_CORE2_DomainRangePushEx, reinterpret_cast<NvtxFunctionPointer>(&DomainRangePushEx));
  set(NVTX_CBID_CORE2_DomainRangePop, reinterpret_cast<NvtxFunctionPointer>(&DomainRangePop));
  set(NVTX_CBID_CORE2_DomainRangeStartEx, reinterpret_cast<NvtxFunctionPointer>(&DomainRangeStartEx));
  set(NVTX_CBID_CORE2_DomainRangeEnd, reinterpret_cast<NvtxFunctionPointer>(&DomainRangeEnd));
  return 1;
}
