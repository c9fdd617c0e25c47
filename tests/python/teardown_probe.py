"""A program whose rank CRASH_RANK (default 1) dies of SIGABRT as its interpreter tears down,
after its work, as PyTorch 2.x processes now and then do ("terminate called without an active
exception" at exit; tests/multiproc/dlrun_lifecycle_test.cc). No torch: the crash is an
atexit handler that aborts. SAY_DONE=1: every rank calls dlrun_report.done() first;
EXIT_CODE=N: every rank ends with sys.exit(N). Prints "teardown_probe: rank R work done"."""
import atexit
import os
import sys

import dlrun_report

rank = int(os.environ["RANK"])
if rank == int(os.environ.get("CRASH_RANK", "1")):
    atexit.register(os.abort)  # runs as the interpreter ends, where the teardown crash comes
print("teardown_probe: rank %d work done" % rank, flush=True)
if os.environ.get("SAY_DONE") == "1":
    dlrun_report.done()
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
