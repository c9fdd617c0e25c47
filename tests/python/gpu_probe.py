"""The launcher's GPU path, for scripts/gpu-check on a machine with NVIDIA GPUs (none here).
Every rank takes the GPU of its LOCAL_RANK, joins an NCCL group, and for STEPS steps (default
40) multiplies matrices and all_reduces the result, sending a step record each step
(dlrun_report), so the agent's NVML sampler sees the GPU busy. Prints "gpu_probe: rank R on GPU
NAME, all_reduce sum S" at the end. GPU_FAULT=1 instead triggers a device-side assert (an index
out of range on the GPU), which surfaces as "RuntimeError: CUDA error: device-side assert
triggered": the program's own bug, which the agent must not count as a fault of the node."""
import os
import time

import torch
import torch.distributed as dist

import dlrun_report


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    if os.environ.get("GPU_FAULT") == "1":
        x = torch.zeros(8, device=dev)
        x[torch.tensor([1 << 20], device=dev)] = 1.0
        torch.cuda.synchronize()
        return
    dist.init_process_group("nccl", device_id=dev)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    total = torch.zeros(1, device=dev)
    for step in range(int(os.environ.get("STEPS", "40"))):
        t0 = time.monotonic()
        for _ in range(20):
            b = a @ a
        s = b.float().mean().reshape(1)
        dist.all_reduce(s)
        total += s
        torch.cuda.synchronize()
        dlrun_report.report_step(step, samples=1, step_s=time.monotonic() - t0)
    print(f"gpu_probe: rank {dist.get_rank()} on GPU {torch.cuda.get_device_name(dev)}, "
          f"all_reduce sum {total.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
