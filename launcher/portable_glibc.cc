// Built into dlrun only with DLRUN_PORTABLE (the wheel): the functions and the one variable of
// glibc newer than 2.28 that the statically linked C++ runtime and Debian's static archives
// use, defined here so that the executable needs glibc 2.28 only (docs/PACKAGING.md: RHEL/Rocky
// 8, SUSE 15, Ubuntu 20.04 and later; the wheel links against glibc 2.28's symbol set,
// scripts/glibc-stubs). Each definition is what that code did on glibc before the function
// existed. The dynamic linker resolves the executable's own definitions first; glibc's internal
// callers use their internal aliases and are not affected.
//   arc4random (2.36): libstdc++'s std::random_device, used by our jitter and gRPC's RLS.
//   _dl_find_object (2.35): libgcc's unwinder, which finds a frame's unwind tables with it on
//     every exception; the same answer from dl_iterate_phdr (what libgcc used before 2.35).
//   __libc_single_threaded (2.32): libstdc++ skips atomic reference counts while it is non-zero;
//     here always 0, so they are always atomic (libstdc++'s behaviour before 2.32).
//   pthread_cond_clockwait (2.30): std::condition_variable's waits on steady_clock; the
//     monotonic deadline converted to the realtime clock for pthread_cond_timedwait, which is
//     what libstdc++ does itself where glibc lacks the call (a waiter may wake early: every
//     caller re-checks its clock).
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
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

extern "C" {
char __libc_single_threaded = 0;
}

extern "C" int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex,
                                      clockid_t clock, const struct timespec* abstime) {
  if (clock == CLOCK_REALTIME) return pthread_cond_timedwait(cond, mutex, abstime);
  if (clock != CLOCK_MONOTONIC) return EINVAL;
  timespec mono{}, real{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  constexpr int64_t kNs = 1000000000;
  const int64_t left = (abstime->tv_sec - mono.tv_sec) * kNs + (abstime->tv_nsec - mono.tv_nsec);
  const int64_t until = real.tv_sec * kNs + real.tv_nsec + (left > 0 ? left : 0);
  const timespec deadline{static_cast<time_t>(until / kNs), static_cast<long>(until % kNs)};
  return pthread_cond_timedwait(cond, mutex, &deadline);
}
