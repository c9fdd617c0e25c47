"""A gloo job where one rank stops taking part: every rank all_reduces in a loop, and rank
HANG_RANK (default 2) sleeps before its HANG_STEP-th (default 30) all_reduce, so the others wait
in all_reduce. Prints "hang_probe: rank R waiting" once it is in place (for `dlrun stacks`
tests). HANG_KIND=segv makes that rank die of SIGSEGV instead, and the others wait on the job's
store rather than in all_reduce (Gloo would end their all_reduce at once when the peer dies, so
their stacks would race the capture; NCCL's would wait for its timeout). COLLECTIVE_TIMEOUT=S
gives the group that timeout, FLIGHT_RECORDER=1 has every rank dump its collective history
through dlrun_report when it fails or is stopped. HANG_KIND=stop: that rank stops itself with
SIGSTOP; HANG_KIND=loader: that rank reads a DataLoader whose worker process deadlocks (a lock
taken twice). REPORT_STEPS=1: every rank sends a step record after each all_reduce (dlrun_report),
and a restarted attempt (TORCHELASTIC_RESTART_COUNT > 0) does not stall but ends after its
HANG_STEP + 5 steps. HANG_KIND=recv: that rank waits in a recv nobody sends to while the others
wait in all_reduce (every rank waits for another, in torch.distributed). HANG_RECORD=1: main runs under torchelastic's
`@record`, as many scripts do (its frame is the outermost of every rank). HANG_KIND=pause (with
REPORT_STEPS=1): at HANG_STEP every rank evaluates (see evaluate) and the job goes on."""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


class _DeadlockedDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        import threading
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # the loader worker's deadlock


def stall(rank, kind):
    print(f"hang_probe: rank {rank} waiting", flush=True)
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)  # the crash's line
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # the stopped rank's line
    if kind == "recv":
        dist.recv(torch.zeros(1), src=(rank + 1) % dist.get_world_size())  # nobody sends
    if kind == "loader":
        loader = torch.utils.data.DataLoader(_DeadlockedDataset(), num_workers=1)
        for _ in loader:  # the rank whose loader is deadlocked
            pass
    time.sleep(3600)  # the stalled rank's line


def evaluate(report):
    """HANG_KIND=pause: every rank spends PAUSE_S seconds on work that is not a step, declared
    with dlrun_report.pause (PAUSE_UNDECLARED=1: not declared)."""
    print(f"hang_probe: rank {dist.get_rank()} evaluating", flush=True)
    seconds = float(os.environ.get("PAUSE_S", "10"))
    if os.environ.get("PAUSE_UNDECLARED") == "1":
        time.sleep(seconds)
        return
    with report.pause("eval"):
        time.sleep(seconds)


def wait_for_peer():
    store = dist.distributed_c10d._get_default_store()
    # where the others wait for a crashed rank:
    store.wait(["hang_probe_never_set"], datetime.timedelta(hours=1))


def main():
    timeout = os.environ.get("COLLECTIVE_TIMEOUT")  # seconds: the others' all_reduce fails
    if timeout:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(timeout)))
    else:
        dist.init_process_group("gloo")
    if os.environ.get("FLIGHT_RECORDER"):
        import dlrun_report
        assert dlrun_report.dump_collectives_on_failure(), "no flight recorder dump file set"
    rank = dist.get_rank()
    hang_rank = int(os.environ.get("HANG_RANK", "2"))
    hang_step = int(os.environ.get("HANG_STEP", "30"))
    kind = os.environ.get("HANG_KIND", "sleep")
    t = torch.ones(4)
    report = None
    if os.environ.get("REPORT_STEPS"):
        import dlrun_report as report
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
            hang_step = -1  # the restarted attempt runs through
    for step in range(1, 10**9):
        if kind == "pause" and step == hang_step:
            evaluate(report)
        elif rank == hang_rank and step == hang_step:
            stall(rank, kind)
        if rank != hang_rank and step == hang_step:
            print(f"hang_probe: rank {rank} waiting", flush=True)
            if kind == "segv":
                wait_for_peer()
        t0 = time.perf_counter()
        dist.all_reduce(t)  # where the others wait for a stalled rank
        if report:
            report.report_step(step, 1, time.perf_counter() - t0)
            time.sleep(0.05)
        if step > (hang_step if hang_step > 0 else 25) + 5:
            break
    dist.destroy_process_group()
    if report:
        report.done()
    return 0


if __name__ == "__main__":
    if os.environ.get("HANG_RECORD"):
        from torch.distributed.elastic.multiprocessing.errors import record
        main = record(main)
    sys.exit(main())
