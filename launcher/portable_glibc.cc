// Built into dlrun only with DLRUN_PORTABLE (the wheel): the two functions of glibc newer than
// 2.34 that the statically linked C++ runtime calls, defined here so that the executable needs
// glibc 2.34 only (docs/PACKAGING.md: RHEL/Rocky 9 has 2.34, Ubuntu 22.04 2.35, the build
// machine 2.36). The dynamic linker resolves the executable's own definitions first; glibc's
// internal callers use their internal aliases and are not affected.
//   arc4random (2.36): libstdc++'s std::random_device, used by our jitter and gRPC's RLS.
//   _dl_find_object (2.35): libgcc's unwinder, which finds a frame's unwind tables with it on
//     every exception; the same answer from dl_iterate_phdr (what libgcc used before 2.35).
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstring>

extern "C" uint32_t arc4random(void) noexcept {
  uint32_t v = 0;
  char* p = reinterpret_cast<char*>(&v);
  size_t got = 0;
  while (got < sizeof v) {
    ssize_t n = getrandom(p + got, sizeof v - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      abort();  // as glibc's: no entropy source is not an error to go on from
    }
  }
  return v;
}

namespace {

struct Lookup {
  uintptr_t pc;
  dl_find_object* out;
  bool found;
};

int FindObject(dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<Lookup*>(data);
  const ElfW(Phdr)* eh = nullptr;
  bool inside = false;
  uintptr_t start = 0, end = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD) {
      const uintptr_t s = info->dlpi_addr + ph.p_vaddr, e = s + ph.p_memsz;
      if (q->pc >= s && q->pc < e) {
        inside = true;
        start = s;
        end = e;
      }
    } else if (ph.p_type == PT_GNU_EH_FRAME) {
      eh = &ph;
    }
  }
  if (!inside) return 0;
  std::memset(q->out, 0, sizeof *q->out);
  q->out->dlfo_map_start = reinterpret_cast<void*>(start);
  q->out->dlfo_map_end = reinterpret_cast<void*>(end);
  q->out->dlfo_eh_frame =
      eh == nullptr ? nullptr : reinterpret_cast<void*>(info->dlpi_addr + eh->p_vaddr);
  q->found = true;
  return 1;
}

}  // namespace

extern "C" int _dl_find_object(void* pc, dl_find_object* result) noexcept {
  Lookup q{reinterpret_cast<uintptr_t>(pc), result, false};
  dl_iterate_phdr(FindObject, &q);
  return q.found ? 0 : -1;
}
