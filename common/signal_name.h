// The abbreviated name of a signal ("TERM" for SIGTERM), as glibc's sigabbrev_np, which only
// glibc 2.32 and later have: the wheel's dlrun runs on glibc 2.28 (docs/PACKAGING.md) and the
// worker library compiles there. Async-signal-safe (the worker's crash handler calls it).
// nullptr for a number that is not a signal of the kernel's standard set (real-time signals).
#pragma once

#include <signal.h>

namespace dlrun {

inline const char* SignalAbbrev(int sig) noexcept {
  switch (sig) {
    case SIGHUP: return "HUP";
    case SIGINT: return "INT";
    case SIGQUIT: return "QUIT";
    case SIGILL: return "ILL";
    case SIGTRAP: return "TRAP";
    case SIGABRT: return "ABRT";
    case SIGBUS: return "BUS";
    case SIGFPE: return "FPE";
    case SIGKILL: return "KILL";
    case SIGUSR1: return "USR1";
    case SIGSEGV: return "SEGV";
    case SIGUSR2: return "USR2";
    case SIGPIPE: return "PIPE";
    case SIGALRM: return "ALRM";
    case SIGTERM: return "TERM";
#ifdef SIGSTKFLT
    case SIGSTKFLT: return "STKFLT";
#endif
    case SIGCHLD: return "CHLD";
    case SIGCONT: return "CONT";
    case SIGSTOP: return "STOP";
    case SIGTSTP: return "TSTP";
    case SIGTTIN: return "TTIN";
    case SIGTTOU: return "TTOU";
    case SIGURG: return "URG";
    case SIGXCPU: return "XCPU";
    case SIGXFSZ: return "XFSZ";
    case SIGVTALRM: return "VTALRM";
    case SIGPROF: return "PROF";
    case SIGWINCH: return "WINCH";
    case SIGIO: return "POLL";  // glibc's name for 29 (SIGIO and SIGPOLL alike)
    case SIGPWR: return "PWR";
    case SIGSYS: return "SYS";
    default: return nullptr;
  }
}

}  // namespace dlrun
