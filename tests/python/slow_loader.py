"""A DDP program whose DataLoader is the bottleneck: its one worker process spends SPIN seconds
of CPU on each sample while the model's step is a few milliseconds. Steps are reported by
dlrun_report.timed(loader, report=True). Usage: slow_loader.py STEPS SPIN"""
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import dlrun_report


class Slow(Dataset):
    def __init__(self, n, spin):
        self.n, self.spin = n, spin

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.process_time() + self.spin  # CPU work, as decoding and augmenting are
        x = 0
        while time.process_time() < end:
            x += 1
        return torch.full((8,), float(i % 7))


def main():
    steps, spin = int(sys.argv[1]), float(sys.argv[2])
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(2 * steps, spin), batch_size=2, num_workers=1, prefetch_factor=2,
                        persistent_workers=True)
    batches = dlrun_report.timed(loader, report=True)
    for x in batches:
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        batches.loss = loss.item()
    dist.destroy_process_group()
    dlrun_report.done()


if __name__ == "__main__":
    main()
