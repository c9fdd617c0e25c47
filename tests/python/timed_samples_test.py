"""dlrun_report.timed(report=True) counts a batch's samples from its first batched tensor (issue
41: a `(step, x, y)` batch was counted as 1 sample), and `samples=` overrides it. Reads the step
records timed() writes on the pipe dlrun would pass in DLRUN_HEARTBEAT_FD."""
import os
import sys

import torch

read_fd, write_fd = os.pipe()
os.environ["DLRUN_HEARTBEAT_FD"] = str(write_fd)
import dlrun_report  # noqa: E402  (reads the variable when it first writes)


def records(loader, **kwargs):
    for _ in dlrun_report.timed(loader, report=True, **kwargs):
        pass
    data = os.read(read_fd, 65536).decode()
    return [line.split() for line in data.splitlines() if line.startswith("S ")]


def samples_of(loader, **kwargs):
    return [int(r[2]) for r in records(loader, **kwargs)]


failures = []


def expect(what, got, want):
    if got != want:
        failures.append("%s: got %r, expected %r" % (what, got, want))


x, y = torch.zeros(8, 3), torch.zeros(8)
expect("(step, x, y) batches", samples_of([(0, x, y), (1, x, y)]), [8, 8])
expect("(x, y) batches", samples_of([(x, y)]), [8])
expect("dict batches", samples_of([{"step": 3, "image": x, "label": y}]), [8])
expect("a tensor batch", samples_of([torch.zeros(5, 2)]), [5])
expect("a list of plain items", samples_of([["a", "b", "c"]]), [3])
expect("samples= overrides", samples_of([(0, x, y)], samples=32), [32])
expect("a scalar-only batch", samples_of([(torch.tensor(1.0), 2)]), [1])
if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("ok: timed(report=True) counts samples from the first batched tensor")
