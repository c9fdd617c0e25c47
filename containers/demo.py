"""The image's demo (containers/Containerfile's CMD): `dlrun --nproc-per-node 2 demo.py`.

With torch (the image's default): a small 3D convolutional network trained with
DistributedDataParallel (Gloo on CPUs, NCCL on GPUs) on synthetic volumes for 20 steps, each
step reported to dlrun (the job report at the end has the step times). Without torch (the image
the tests build, --build-arg TORCH=): the same loop of reported steps over plain Python work, so
that the launcher, the rendezvous and the report are shown all the same."""
import os
import sys
import time

import dlrun_report  # on the workers' path: dlrun puts share/dlrun/python there

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
steps = int(os.environ.get("DEMO_STEPS", "20"))

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
except ImportError:
    torch = None

if torch is None:
    print("rank %d of %d: torch is not in this image; %d reported steps of plain Python" % (rank, world, steps), flush=True)
    acc = 0.0
    for step in range(steps):
        t0 = time.monotonic()
        acc += sum(i * i for i in range(20000)) * 1e-12
        dlrun_report.report_step(step, samples=1, step_s=time.monotonic() - t0, loss=1.0 / (step + 1))
    print("rank %d: done (%d steps)" % (rank, steps), flush=True)
    sys.exit(0)

backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend)
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv3d(8, 8, 3, padding=1), nn.ReLU(),
                      nn.Conv3d(8, 4, 1)).to(device)
ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if backend == "nccl" else None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05 * world)
g = torch.Generator().manual_seed(1 + rank)
for step in range(steps):
    t0 = time.monotonic()
    x = torch.randn(2, 4, 16, 16, 16, generator=g).to(device)
    loss = nn.functional.mse_loss(ddp(x), x)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    dlrun_report.report_step(step, samples=x.shape[0], step_s=time.monotonic() - t0, loss=loss.item())
    if rank == 0 and step % 5 == 0:
        print("step %d loss %.4f" % (step, loss.item()), flush=True)
print("rank %d: done (%d steps, %s, final loss %.4f)" % (rank, steps, backend, loss.item()), flush=True)
dist.destroy_process_group()
