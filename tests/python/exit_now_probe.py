"""dlrun_step.exit_now (the exit of a Recoverable program after an uncaught exception): the
program's atexit functions run and the files it left open are flushed before os._exit, with the
exit code asked. Run as a child of itself: the child writes to a buffered file and a text file it
never closes, registers an atexit function, and calls exit_now(3)."""
import atexit
import os
import subprocess
import sys
import tempfile

import dlrun_step

if len(sys.argv) > 1:  # the child
    d = sys.argv[1]
    raw = open(os.path.join(d, "raw.bin"), "wb")
    raw.write(b"bytes never flushed by the program")
    text = open(os.path.join(d, "text.log"), "w")
    text.write("a line never flushed by the program\n")
    atexit.register(lambda: open(os.path.join(d, "atexit"), "w").write("ran"))
    dlrun_step.exit_now(3)
    sys.exit("exit_now returned")
d = tempfile.mkdtemp()
rc = subprocess.run([sys.executable, __file__, d]).returncode
got = {n: open(os.path.join(d, n), "rb").read() for n in ("raw.bin", "text.log", "atexit")
       if os.path.exists(os.path.join(d, n))}
want = {"raw.bin": b"bytes never flushed by the program",
        "text.log": b"a line never flushed by the program\n", "atexit": b"ran"}
if rc != 3 or got != want:
    sys.exit("exit_now: rc %d (expected 3), files %r (expected %r)" % (rc, got, want))
print("ok: exit code 3, the atexit function ran, both files flushed")
