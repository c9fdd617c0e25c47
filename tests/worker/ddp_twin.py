"""The Python side of the DDP equivalence tests (tests/worker/ddp_test.cc): PyTorch's own
DistributedDataParallel trains the model ddp_check's twin modes train with dlrun::worker's, on
the same initial values and data, and each rank writes its final parameters (float64, in
registration order) to OUT/py-rank<RANK>.bin for the test to compare.
  ddp_twin.py --mode fp16|bf16|static|join --out DIR   (under dlrun or torchrun, 2 ranks, gloo)"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, LOCAL = 5, 4


class Net(torch.nn.Module):
    def __init__(self, with_unused):
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 4)
        self.unused = torch.nn.Linear(32, 4) if with_unused else None

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True, choices=["fp16", "bf16", "static", "join"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_default_dtype(torch.float64)
    model = Net(with_unused=args.mode == "static")
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    ddp = DDP(model, static_graph=args.mode == "static")
    if args.mode == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.mode == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    # join: rank r has STEPS + 2r batches; every rank draws the longest sequence alike.
    steps = STEPS + 2 * rank if args.mode == "join" else STEPS
    most = STEPS + 2 * (world - 1) if args.mode == "join" else STEPS
    torch.manual_seed(100)
    data = [(torch.randn(world * LOCAL, 8), torch.randn(world * LOCAL, 4)) for _ in range(most)]

    def train():
        for x, y in data[:steps]:
            mine = slice(rank * LOCAL, (rank + 1) * LOCAL)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
            opt.step()

    if args.mode == "join":
        with ddp.join():
            train()
    else:
        train()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(torch.float64)
    with open(os.path.join(args.out, f"py-rank{rank}.bin"), "wb") as f:
        f.write(flat.numpy().tobytes())
    print(f"ddp_twin ok: {args.mode}, rank {rank}, {steps} steps", flush=True)
    dist.destroy_process_group()
    # The figures are written and flushed. PyTorch's own interpreter teardown occasionally aborted
    # after this point ("terminate called without an active exception", SIGABRT, once in a CI
    # run with the fp16 hook): the reference DDP's threads, not what the test compares.
    os._exit(0)


if __name__ == "__main__":
    main()
