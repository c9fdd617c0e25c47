"""A small Gloo job for dlrun's --profile tests (docs/PROFILING.md): each step spends its time in
`hot_function`, then meets the other ranks in an all_reduce, and reports the step through
dlrun_report. Each rank prints how it was started, so a test can compare a profiled rank with an
unprofiled one:

  profile_probe: rank R cmdline=[...] parent=COMM profile=TOOL-or-none

  profile_probe.py STEPS [MARKER_FILE]   (MARKER_FILE: created by each rank that started)
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import dlrun_report


def hot_function(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def main():
    steps = int(sys.argv[1])
    if len(sys.argv) > 2:
        open(sys.argv[2], "a").close()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [a.decode() for a in f.read().split(b"\0") if a]
    with open("/proc/%d/comm" % os.getppid()) as f:
        parent = f.read().strip()
    print("profile_probe: rank %d cmdline=%s parent=%s profile=%s"
          % (rank, json.dumps(cmdline), parent, os.environ.get("DLRUN_PROFILE", "none")), flush=True)
    for step in range(steps):
        t0 = time.monotonic()
        hot_function(300000)
        t = torch.ones(4)
        dist.all_reduce(t)
        dlrun_report.report_step(step, samples=1, step_s=time.monotonic() - t0)
    dist.destroy_process_group()


main()
# torch 2.15's profiler (kineto, on the CUDA build without a GPU) sometimes aborts in the C++
# teardown after the interpreter exits ("terminate called without an active exception"; once in
# CI, after the trace was written): leave without running it. docs/PROFILING.md has the note.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
