"""A gloo job where one rank stops taking part: every rank all_reduces in a loop, and rank
HANG_RANK (default 2) sleeps before its HANG_STEP-th (default 30) all_reduce, so the others wait
in all_reduce. Prints "hang_probe: rank R waiting" once it is in place (for `dlrun stacks`
tests), and HANG_KIND=segv makes that rank die of SIGSEGV instead of sleeping."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def stall(rank, kind):
    print(f"hang_probe: rank {rank} waiting", flush=True)
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(3600)  # the stalled rank's line


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hang_rank = int(os.environ.get("HANG_RANK", "2"))
    hang_step = int(os.environ.get("HANG_STEP", "30"))
    kind = os.environ.get("HANG_KIND", "sleep")
    t = torch.ones(4)
    for step in range(1, 10**9):
        if rank == hang_rank and step == hang_step:
            stall(rank, kind)
        if rank != hang_rank and step == hang_step:
            print(f"hang_probe: rank {rank} waiting", flush=True)
        dist.all_reduce(t)  # the waiting ranks' line
        if step > hang_step + 5:
            break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
