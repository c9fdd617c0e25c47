"""A small gloo DDP trainer using dlrun_recovery (tests/multiproc/dlrun_python_recovery_test.cc,
bench/inprocess_recovery): an MLP, AdamW and a StepLR schedule, each step's data drawn from
(step, rank), so a run with a fault can end bit-identical to one without.

usage: recoverable_train.py STEPS [STEP_S]
KILL_RANK=R KILL_STEP=N: rank R SIGKILLs itself at the start of step N (its first process;
N1,N2,...: at each, whichever process of rank R meets it, once each);
KILL_HOW=raise: raises an exception there instead (an error of the program's own).
FAIL_REPLACEMENT=differs: the replacement's state is changed as it arrives (its parameters differ
from its peers'), so the recovery must refuse to go on.
CKPT_DIR=D CKPT_EVERY=K: rank 0 writes a checkpoint every K steps (atomically), and a start that
is not a replacement resumes from it ("resumed from step S"), for the restart comparisons.
BACKEND=nccl: the model and data on GPU LOCAL_RANK % the GPUs there, NCCL (scripts/gpu-nccl-recovery);
with SHARE_GPU=1 the ranks share the GPUs, each told it is a host of its own (NCCL_HOSTID), which
NCCL otherwise refuses ("Duplicate GPU detected"); their traffic then goes over sockets.
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
backend = os.environ.get("BACKEND", "gloo")
dev = torch.device("cpu")
if backend == "nccl":
    local_rank = int(os.environ["LOCAL_RANK"])
    if os.environ.get("SHARE_GPU") == "1":
        os.environ.update(NCCL_HOSTID="rank-%d-host" % local_rank, NCCL_P2P_DISABLE="1",
                          NCCL_SHM_DISABLE="1")
    dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
dist.init_process_group(backend)
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
model.to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
ckpt_dir, ckpt_every = os.environ.get("CKPT_DIR"), int(os.environ.get("CKPT_EVERY", "0"))
path = os.path.join(ckpt_dir, "latest.pt") if ckpt_dir else None
start = 0
if path and os.path.exists(path) and not dlrun_recovery.is_replacement():
    t0 = time.monotonic()
    state = torch.load(path, map_location=dev)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    start = state["step"] + 1
    dlrun_report.report_resume(state["step"], time.monotonic() - t0)
    print("rank %d resumed from step %d" % (rank, state["step"]), flush=True)


class Differs:
    """Stateful: changes a parameter of the model when the state from a peer is loaded."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
        print("rank %d: FAIL_REPLACEMENT=differs: parameters changed" % rank, flush=True)


extra = [Differs()] if os.environ.get("FAIL_REPLACEMENT") == "differs" else []
rec = dlrun_recovery.Recoverable(model, opt, sched, *extra)
print("rank %d pid %d" % (rank, os.getpid()), flush=True)
kill_rank = int(os.environ.get("KILL_RANK", "-1"))
kill_steps = [int(k) for k in os.environ.get("KILL_STEP", "-1").split(",")]
first = not rec.replacement and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def kill_now(step):
    """KILL_STEP=S: at step S in rank KILL_RANK's first process; S1,S2,...: each once (a marker
    in CKPT_DIR), whichever process of that rank meets it (a replacement is killed again)."""
    if rank != kill_rank or step not in kill_steps:
        return False
    if len(kill_steps) == 1 or not ckpt_dir:
        return first
    marker = os.path.join(ckpt_dir, "killed-%d" % step)
    if os.path.exists(marker):
        return False
    os.makedirs(ckpt_dir, exist_ok=True)
    open(marker, "w").close()
    return True
for step in rec.steps(steps, start=start):
    with rec.step() as s:
        began = time.time()
        if kill_now(step):
            print("rank %d killed at %.6f" % (rank, time.time()), flush=True)
            if os.environ.get("KILL_HOW") == "raise":
                raise ValueError("an error of the program's own in step %d" % step)
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 32, generator=g).to(dev)
        loss = torch.nn.functional.mse_loss(rec.ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        time.sleep(step_s)
        print("rank %d step %d began %.6f" % (rank, step, began), flush=True)
    if not s.committed:
        continue  # given up: done again (a checkpoint or a report here would be of no step)
    dlrun_report.report_step(step, samples=16, step_s=time.time() - began, loss=loss.item())
    if path and rank == 0 and ckpt_every and (step + 1) % ckpt_every == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "step": step}, path + ".tmp")
        os.replace(path + ".tmp", path)
print("rank %d digest %d recoveries %d" % (rank, dlrun_recovery._digest(model), rec.recoveries),
      flush=True)
dist.destroy_process_group()
dlrun_report.done()  # a crash in the teardown after this is no failure (docs/USAGE.md, Done)
