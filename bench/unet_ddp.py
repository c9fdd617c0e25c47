# The Python baseline for bench/ddp_overhead: the same SC22 U-Net, synthetic data and loop as
# build/bin/train_unet, with PyTorch's own DistributedDataParallel (gloo). Run under dlrun (or
# torchrun) with 2 workers. Comparison only: nothing in dlrun's product path uses Python.
#   python3 bench/unet_ddp.py --base-channels 16 --max-steps 12 [--no-grad-sync] --metrics-json F
# --device cuda (scripts/gpu-check): NCCL, one GPU per rank (LOCAL_RANK), the batches made on the
# GPU, cuDNN autotuning, and --amp (float16 autocast with a GradScaler, as train_unet's AMP) and
# --channels-last as train_unet's flags.
import argparse
import contextlib
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--amp", action="store_true", help="CUDA: float16 autocast, GradScaler")
    ap.add_argument("--channels-last", action="store_true", help="channels-last 3D tensors")
    ap.add_argument("--report-steps", action="store_true",
                    help="send each step to dlrun through python/dlrun_report.py (--profile's "
                    "step ranges, per-rank step times in the report)")
    a = ap.parse_args()
    report = None
    if a.report_steps:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import dlrun_report as report
    cuda = a.device == "cuda"
    if cuda:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    fmt = torch.channels_last_3d if a.channels_last else torch.contiguous_format
    net = UNet(a.base_channels).to(dev, memory_format=fmt)
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda and a.amp)
    mix = (torch.randn(5, 4) * 0.5).to(dev)
    gen = torch.Generator(device=dev).manual_seed(1234 * 7919 + rank + 1)
    s = a.data_size
    for step in range(1, a.max_steps + 1):
        if step == a.warmup_steps + 1:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        step_start = time.perf_counter()
        x = torch.randn(a.local_batch_size, 4, s, s, s, generator=gen, device=dev)
        y = torch.tanh(torch.einsum("oi,nidhw->nodhw", mix, x))
        x, y = x.contiguous(memory_format=fmt), y.contiguous(memory_format=fmt)
        opt.zero_grad(set_to_none=True)
        with model.no_sync() if a.no_grad_sync else contextlib.nullcontext():
            with torch.autocast("cuda", dtype=torch.float16, enabled=cuda and a.amp):
                loss = torch.nn.functional.l1_loss(model(x).float(), y)
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if report is not None:
            report.report_step(step, a.local_batch_size, time.perf_counter() - step_start)
    if cuda:
        torch.cuda.synchronize()
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
