"""dlrun_report.Preemption ignores a preemption warning that arrives once the program exits.

Slurm signals each node's job step at its own moment: a rank that already stopped at the step
every rank agreed on can get SIGUSR1 while its interpreter shuts down, and CPython restores the
default action (death) of a signal it handled. The hook's exit handler sets SIG_IGN first, so
the late signal is ignored. An exit handler registered before the hook runs after it (atexit is
last in, first out): it checks the disposition and sends the late signal itself.
Exit 0 and "ignored" when the hook does its part.
"""
import atexit
import os
import signal
import sys


def late_warning():
    ignored = signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    print("ignored" if ignored else "still handled: %r" % (signal.getsignal(signal.SIGUSR1),),
          flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)
    if not ignored:
        os._exit(3)


atexit.register(late_warning)
import dlrun_report  # noqa: E402

hook = dlrun_report.Preemption()
os.kill(os.getpid(), signal.SIGUSR1)  # the warning while running: caught, a checkpoint is due
assert hook.requested(sync=False), "the hook missed the warning"
sys.exit(0)
