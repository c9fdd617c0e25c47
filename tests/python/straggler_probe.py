"""A synchronous data-parallel loop without a model, for dlrun's straggler tests: every rank
"computes" (sleeps) the same time per step, then all ranks meet in a Gloo allreduce, and each
reports its step with the compute/sync split through dlrun_report. A rank slowed from outside
(SIGSTOP/SIGCONT pulses) computes longer and waits less in the sync than the others.

  straggler_probe.py SECONDS COMPUTE_S
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import dlrun_report

seconds, compute = float(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"ready {os.getpid()}", flush=True)
start = time.monotonic()
step = 0
while True:
    t0 = time.monotonic()
    time.sleep(compute)
    t1 = time.monotonic()
    # Rank 0's clock decides when every rank stops, in the same allreduce as the step's sync.
    stop = torch.tensor([1.0 if rank == 0 and t1 - start > seconds else 0.0])
    dist.all_reduce(stop)
    t2 = time.monotonic()
    step += 1
    dlrun_report.report_step(step, samples=2, step_s=t2 - t0, compute_s=t1 - t0, sync_s=t2 - t1)
    if stop.item() > 0:
        break
dist.destroy_process_group()
dlrun_report.done()
