"""A small gloo DDP trainer using dlrun_recovery (tests/multiproc/dlrun_python_recovery_test.cc,
bench/inprocess_recovery): an MLP, AdamW and a StepLR schedule, each step's data drawn from
(step, rank), so a run with a fault can end bit-identical to one without.

usage: recoverable_train.py STEPS [STEP_S]
KILL_RANK=R KILL_STEP=N: rank R SIGKILLs itself at the start of step N (its first process).
Lines: "rank R pid P" at start, "rank R step N began T" per step (T: unix seconds), "rank R
killed at T" before the kill, "rank R digest D recoveries K" at the end."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import dlrun_recovery
import dlrun_report

steps = int(sys.argv[1])
step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
rec = dlrun_recovery.Recoverable(model, opt, sched)
print("rank %d pid %d" % (rank, os.getpid()), flush=True)
kill_rank = int(os.environ.get("KILL_RANK", "-1"))
kill_step = int(os.environ.get("KILL_STEP", "-1"))
first = not rec.replacement and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
for step in rec.steps(steps):
    with rec.step():
        began = time.time()
        if rank == kill_rank and step == kill_step and first:
            print("rank %d killed at %.6f" % (rank, time.time()), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 32, generator=g)
        loss = torch.nn.functional.mse_loss(rec.ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        time.sleep(step_s)
        dlrun_report.report_step(step, samples=16, step_s=time.time() - began, loss=loss.item())
        print("rank %d step %d began %.6f" % (rank, step, began), flush=True)
print("rank %d digest %d recoveries %d" % (rank, dlrun_recovery._digest(model), rec.recoveries),
      flush=True)
dist.destroy_process_group()
