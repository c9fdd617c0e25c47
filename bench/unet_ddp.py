# The Python baseline for bench/ddp_overhead: the same SC22 U-Net, synthetic data and loop as
# build/bin/train_unet, with PyTorch's own DistributedDataParallel (gloo). Run under dlrun (or
# torchrun) with 2 workers. Comparison only: nothing in dlrun's product path uses Python.
#   python3 bench/unet_ddp.py --base-channels 16 --max-steps 12 [--no-grad-sync] --metrics-json F
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def down(i, o):
    return nn.Sequential(nn.Conv3d(i, o, 4, stride=2, padding=1), nn.LeakyReLU(inplace=True))


def up(i, o):
    return nn.Sequential(nn.ConvTranspose3d(i, o, 4, stride=2, padding=1), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.conv_down1, self.conv_down2 = down(4, w), down(w, 2 * w)
        self.conv_down3, self.conv_down4 = down(2 * w, 4 * w), down(4 * w, 8 * w)
        self.conv_down5, self.conv_down6 = down(8 * w, 8 * w), down(8 * w, 8 * w)
        self.conv_up6, self.conv_up5 = up(8 * w, 8 * w), up(16 * w, 8 * w)
        self.conv_up4, self.conv_up3 = up(16 * w, 4 * w), up(8 * w, 2 * w)
        self.conv_up2 = up(4 * w, w)
        self.conv_last = nn.ConvTranspose3d(2 * w, 5, 4, stride=2, padding=1)
        for name, p in self.named_parameters():
            nn.init.normal_(p, 0.0, 0.02) if "weight" in name else nn.init.zeros_(p)

    def forward(self, x):
        c1 = self.conv_down1(x)
        c2 = self.conv_down2(c1)
        c3 = self.conv_down3(c2)
        c4 = self.conv_down4(c3)
        c5 = self.conv_down5(c4)
        x = self.conv_up6(self.conv_down6(c5))
        x = self.conv_up5(torch.cat([x, c5], 1))
        x = self.conv_up4(torch.cat([x, c4], 1))
        x = self.conv_up3(torch.cat([x, c3], 1))
        x = self.conv_up2(torch.cat([x, c2], 1))
        return torch.tanh(self.conv_last(torch.cat([x, c1], 1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-channels", type=int, default=16)
    ap.add_argument("--data-size", type=int, default=64)
    ap.add_argument("--local-batch-size", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--no-grad-sync", action="store_true")
    ap.add_argument("--metrics-json", default="")
    ap.add_argument("--report-steps", action="store_true",
                    help="send each step to dlrun through python/dlrun_report.py (--profile's "
                    "step ranges, per-rank step times in the report)")
    a = ap.parse_args()
    report = None
    if a.report_steps:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import dlrun_report as report
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = torch.nn.parallel.DistributedDataParallel(UNet(a.base_channels))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mix = torch.randn(5, 4) * 0.5
    gen = torch.Generator().manual_seed(1234 * 7919 + rank + 1)
    s = a.data_size
    for step in range(1, a.max_steps + 1):
        if step == a.warmup_steps + 1:
            start = time.perf_counter()
        step_start = time.perf_counter()
        x = torch.randn(a.local_batch_size, 4, s, s, s, generator=gen)
        y = torch.tanh(torch.einsum("oi,nidhw->nodhw", mix, x))
        opt.zero_grad(set_to_none=True)
        if a.no_grad_sync:
            with model.no_sync():
                loss = torch.nn.functional.l1_loss(model(x), y)
                loss.backward()
        else:
            loss = torch.nn.functional.l1_loss(model(x), y)
            loss.backward()
        opt.step()
        if report is not None:
            report.report_step(step, a.local_batch_size, time.perf_counter() - step_start)
    secs = time.perf_counter() - start
    sps = (a.max_steps - a.warmup_steps) * a.local_batch_size * world / secs
    if rank == 0:
        print(f"python DDP: {sps:.3f} samples/s over {world} ranks, sync={not a.no_grad_sync}")
        if a.metrics_json:
            with open(a.metrics_json, "w") as f:
                json.dump({"samples_per_sec": sps, "world_size": world}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
