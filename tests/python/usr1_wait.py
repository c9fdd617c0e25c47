"""Waits for SIGUSR1 (Slurm's preemption warning) for up to 60 s: prints "ready", then "rank R got
SIGUSR1" and exits 0 when it came, 1 when not (tests/system/slurm_usr1.sh)."""
import os
import signal
import sys
import threading

got = threading.Event()
signal.signal(signal.SIGUSR1, lambda s, f: got.set())
print("rank %s ready" % os.environ["RANK"], flush=True)
ok = got.wait(60)
print("rank %s %s" % (os.environ["RANK"], "got SIGUSR1" if ok else "no SIGUSR1 within 60 s"),
      flush=True)
sys.exit(0 if ok else 1)
