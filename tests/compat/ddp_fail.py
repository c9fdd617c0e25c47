"""A small gloo DDP training that fails on purpose on rank 1 at step 2, with torchelastic's
@record, so the launcher gets an error file with the traceback. Rank 0 is slow at step 2 (not
inside a collective), so it does not fail in turn: the launcher stops it, and the root cause is
not decided by error-file timestamps, which have one-second resolution."""
import time
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        if step == 2 and rank == 1:
            raise ValueError("rank 1 failed on purpose at step 2")
        if step == 2:
            time.sleep(120)
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        print(f"rank {rank} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError:
        # @record has written the error file. Leave without the interpreter's teardown: torch
        # 2.15 sometimes aborts there ("terminate called without an active exception", then
        # SIGSEGV) while Gloo's threads wait on the peer, which turns exit code 1 into -11
        # under either launcher.
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
