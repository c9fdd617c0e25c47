"""Output a person watches: mode 'line' prints a line and waits; 'crash' prints a line and dies
of SIGKILL; 'bar' draws a progress bar with '\\r' (as tqdm does) and waits."""
import os
import signal
import sys
import time

mode = sys.argv[1]
if mode == "line":
    print("py-line-before-the-wait")
    time.sleep(120)
elif mode == "crash":
    print("py-line-before-the-crash")
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "bar":
    for pct in (10, 20):
        sys.stderr.write(f"\rprogress {pct}%|{'#' * (pct // 10)}")
        sys.stderr.flush()
        time.sleep(0.2)
    time.sleep(120)
