# A worker of tests/system/container_job.sh, run by dlrun inside an OCI container under Slurm:
# it records which interpreter runs it and which container (the identity of its PID 1, the
# agent) it is in, reports a few steps, and on the first attempt rank 1 SIGKILLs itself.
import os
import signal
import sys
import time

import dlrun_report

out = sys.argv[1]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with open("/proc/1/stat") as f:
    pid1_start = f.read().rsplit(")", 1)[1].split()[19]  # field 22: start time of PID 1
with open("/proc/1/cmdline", "rb") as f:
    pid1 = f.read().split(b"\0")[0].decode()
record = os.path.join(out, "attempt%d-rank%d" % (attempt, rank))
with open(record + ".tmp", "w") as f:  # whole or not at all: rank 1 waits for it to appear
    f.write("python=%s pid1=%s container=%s@%s slurm_job=%s world=%s\n" % (
        sys.executable, pid1, os.readlink("/proc/self/ns/pid"), pid1_start,
        os.environ.get("SLURM_JOB_ID", ""), os.environ["WORLD_SIZE"]))
os.replace(record + ".tmp", record)
for step in range(5):
    t0 = time.monotonic()
    time.sleep(0.05)
    dlrun_report.report_step(step, samples=1, step_s=time.monotonic() - t0)
    if attempt == 0 and rank == 1 and step == 2:
        # Every rank's record of this attempt first (the test checks them all): on a loaded
        # machine a peer's Python may not have started yet when this one reaches step 2.
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 120
        while not all(os.path.exists(os.path.join(out, "attempt0-rank%d" % r)) for r in range(world)):
            if time.monotonic() > deadline:
                sys.exit("rank 1: not every rank recorded attempt 0 within 120 s")
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
print("rank %d attempt %d: done" % (rank, attempt), flush=True)
