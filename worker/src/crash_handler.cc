// install_crash_trace() (agent_link.h), the worker's side of a crash trace: on a fatal signal,
// the crashing thread's native frames to stderr in the form the agent reads
// (launcher/stacks/crash_trace.h, the reading side), then the default action.
// Only async-signal-safe calls in the handler, but for backtrace() (preloaded at install) and
// dladdr() (a lock-free read of the loaded modules in practice), as every crash reporter does.
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/contract.h"
#include "common/signal_name.h"
#include "dlrun/agent_link.h"

namespace dlrun::worker {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
constexpr int kMaxFrames = 64;

void Put(const char* s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

void PutNumber(uintptr_t v, int base) {
  char buf[32];
  int i = sizeof buf;
  buf[--i] = '\0';
  do {
    buf[--i] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0 && i > 0);
  Put(buf + i);
}

void PutFrame(int n, void* addr) {
  Put("  #");
  PutNumber(static_cast<uintptr_t>(n), 10);
  Put(" ");
  Dl_info info{};
  if (dladdr(addr, &info) != 0 && info.dli_fname != nullptr && *info.dli_fname != '\0') {
    Put(info.dli_fname);
    Put("+0x");
    PutNumber(reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(info.dli_fbase), 16);
    if (info.dli_sname != nullptr) {
      Put(" ");
      Put(info.dli_sname);
    }
  } else {
    Put("??+0x");
    PutNumber(reinterpret_cast<uintptr_t>(addr), 16);
  }
  Put("\n");
}

void* FaultingPc(void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  return reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return reinterpret_cast<void*>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return nullptr;
#endif
}

void OnFatalSignal(int sig, siginfo_t*, void* context) {
  Put("dlrun::worker: fatal signal SIG");
  const char* name = dlrun::SignalAbbrev(sig);
  Put(name != nullptr ? name : "?");
  Put("; native frames (most recent call first):\n");
  void* pc = FaultingPc(context);
  void* frames[kMaxFrames];
  const int n = backtrace(frames, kMaxFrames);
  int k = 0;
  if (pc != nullptr) PutFrame(k++, pc);
  // backtrace() starts in this handler and the kernel's signal trampoline, then the faulting
  // frame (already written as the PC) and its callers.
  int from = 2;
  for (int i = 0; i < n; ++i) {
    if (frames[i] == pc) from = i + 1;
  }
  for (int i = from; i < n; ++i) PutFrame(k++, frames[i]);
  signal(sig, SIG_DFL);
  raise(sig);  // delivered on return, with the default action: the exit status stays the signal
}

}  // namespace

bool install_crash_trace() {
  if (const char* v = std::getenv(contract::kCrashTrace); v != nullptr && std::string(v) == "0") {
    return false;
  }
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  static char alt_stack[64 * 1024];  // a stack overflow's SIGSEGV needs a stack of its own
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  bool any = false;
  for (int sig : kSignals) {
    struct sigaction old{};
    if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO) != 0) {
      continue;  // the program's own handler (or LibTorch's) stays
    }
    struct sigaction sa{};
    sa.sa_sigaction = OnFatalSignal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    any |= sigaction(sig, &sa, nullptr) == 0;
  }
  return any;
}

}  // namespace dlrun::worker
