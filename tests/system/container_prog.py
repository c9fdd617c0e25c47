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
with open(os.path.join(out, "attempt%d-rank%d" % (attempt, rank)), "w") as f:
    f.write("python=%s pid1=%s container=%s@%s slurm_job=%s world=%s\n" % (
        sys.executable, pid1, os.readlink("/proc/self/ns/pid"), pid1_start,
        os.environ.get("SLURM_JOB_ID", ""), os.environ["WORLD_SIZE"]))
for step in range(5):
    t0 = time.monotonic()
    time.sleep(0.05)
    dlrun_report.report_step(step, samples=1, step_s=time.monotonic() - t0)
    if attempt == 0 and rank == 1 and step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
print("rank %d attempt %d: done" % (rank, attempt), flush=True)
