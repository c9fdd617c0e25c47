"""A small Python DDP-style trainer for the preemption test (tests/system/preempt_python.sh):
gloo all-reduces as its steps, a checkpoint (rank 0, written atomically) on the preemption
warning through dlrun_report.Preemption, and a resume from it when the job runs again."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import dlrun_report

steps, ckpt = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
preemption = dlrun_report.Preemption()

start = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        start = json.load(f)["step"]
    if rank == 0:
        print("resumed from step %d" % start, flush=True)

for step in range(start + 1, steps + 1):
    t0 = time.monotonic()
    x = torch.ones(1000) * (rank + 1)
    dist.all_reduce(x)
    time.sleep(0.2)
    if rank == 0:
        print("step %d/%d" % (step, steps), flush=True)
    dlrun_report.report_step(step, samples=1, step_s=time.monotonic() - t0)
    if preemption.requested():
        if rank == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
        preemption.checkpointed(step)
        break
else:
    if rank == 0:
        with open(ckpt + ".done", "w") as f:
            json.dump({"start": start, "steps": steps}, f)
dist.destroy_process_group()
dlrun_report.done()  # a crash in the teardown after this is no failure (docs/USAGE.md, Done)
