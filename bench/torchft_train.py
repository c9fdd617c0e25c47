"""tests/python/recoverable_train.py's training written for TorchFT 0.2 (bench/inprocess_recovery
--program python, the torchft row): the same MLP, AdamW, StepLR and per-(step, rank) data, one
rank per replica group, a Manager per replica and a Lighthouse (torchft_lighthouse) beside them.
Each replica group is its own torchrun (--nproc-per-node 1 --max-restarts 1), which restarts a
killed replica; the new process heals from a peer (TorchFT's checkpoint transport) and the
others go on at the smaller world size meanwhile, as TorchFT does.

usage: torchft_train.py STEPS [STEP_S]   (REPLICA_GROUP_ID, TORCHFT_LIGHTHOUSE in the environment)
KILL_RANK=R KILL_STEP=N: replica R SIGKILLs itself at the start of step N (its first process).
Lines as recoverable_train.py's: "rank R step N began T", "rank R killed at T", "rank R digest D".
Runs in bench/install-peers' environment, never in the project's."""
import hashlib
import os
import signal
import sys
import time
from datetime import timedelta

import torch
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

steps = int(sys.argv[1])
step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
rank = int(os.environ["REPLICA_GROUP_ID"])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def state_dict():
    return {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict()}


def load_state_dict(state):
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])


manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
                  load_state_dict=load_state_dict, state_dict=state_dict,
                  replica_id="replica%d" % rank, timeout=timedelta(seconds=10),
                  heartbeat_interval=timedelta(milliseconds=50))
ddp = DistributedDataParallel(manager, model)
optimizer = Optimizer(manager, opt)
kill_rank = int(os.environ.get("KILL_RANK", "-1"))
kill_step = int(os.environ.get("KILL_STEP", "-1"))
first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
print("rank %d pid %d" % (rank, os.getpid()), flush=True)
while manager.current_step() < steps:
    step = manager.current_step()
    began = time.time()
    if rank == kill_rank and step == kill_step and first:
        print("rank %d killed at %.6f" % (rank, time.time()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    optimizer.zero_grad()  # TorchFT: starts this step's quorum
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 32, generator=g)
    loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
    loss.backward()
    if optimizer.step():  # committed by every replica of the quorum
        sched.step()
    time.sleep(step_s)
    print("rank %d step %d began %.6f" % (rank, step, began), flush=True)
h = hashlib.blake2b(digest_size=8)  # as dlrun_recovery's digest, so the runs compare
for t in list(model.parameters()) + list(model.buffers()):
    h.update(t.detach().contiguous().cpu().numpy().tobytes())
print("rank %d digest %d" % (rank, int.from_bytes(h.digest(), "little", signed=True)), flush=True)
