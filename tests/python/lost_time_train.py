"""A small Python trainer for the restart-ledger test (tests/system/lost_time.sh): gloo
all-reduces as its steps, a checkpoint every EVERY steps (rank 0, written atomically), a resume
from the newest one that it tells dlrun of (dlrun_report.report_resume), and a line per step
with its wall-clock begin and end, the test's own clock for the time the job lost:

    step <n> began <unix s> ended <unix s>

usage: lost_time_train.py STEPS EVERY CKPT_DIR [STEP_S]
CRASH_RANK=R CRASH_STEP=N: rank R exits 1 before step N, in the first attempt only."""
import os
import sys
import time

import torch
import torch.distributed as dist

import dlrun_report

steps, every, ckpt_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
step_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.1
dist.init_process_group("gloo")
rank = dist.get_rank()

start = 0
path = os.path.join(ckpt_dir, "latest.pt")
if os.path.exists(path):
    t0 = time.monotonic()
    start = int(torch.load(path)["step"])
    dlrun_report.report_resume(start, time.monotonic() - t0)
    if rank == 0:
        print("resumed from step %d" % start, flush=True)

crash_rank, crash_step = int(os.environ.get("CRASH_RANK", "-1")), int(os.environ.get("CRASH_STEP", "0"))
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
x = torch.ones(1000)
for step in range(start + 1, steps + 1):
    if rank == crash_rank and step == crash_step and first_attempt:
        print("rank %d: exiting before step %d as asked" % (rank, step), flush=True)
        sys.exit(1)
    began, t0 = time.time(), time.monotonic()
    dist.all_reduce(x)
    time.sleep(step_s)
    dlrun_report.report_step(step, samples=1, step_s=time.monotonic() - t0)
    print("step %d began %.6f ended %.6f" % (step, began, time.time()), flush=True)
    if rank == 0 and step % every == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        torch.save({"step": step}, path + ".tmp")
        os.replace(path + ".tmp", path)
        print("checkpoint saved at step %d" % step, flush=True)
dist.destroy_process_group()
dlrun_report.done()
