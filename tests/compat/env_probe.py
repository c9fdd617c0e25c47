"""Writes what this rank sees to OUT_DIR/<RANK>.json: torchrun's variables, CUDA_VISIBLE_DEVICES,
whether torch.cuda.set_device(int(LOCAL_RANK)) would find its device, and how Python runs."""
import json
import os
import sys

NAMES = ["RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
         "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
         "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "NCCL_ASYNC_ERROR_HANDLING",
         "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"]
env = {n: os.environ.get(n) for n in NAMES}
visible = [d for d in (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d]
env["set_device_local_rank_ok"] = int(os.environ["LOCAL_RANK"]) < len(visible)
env["unbuffered"] = bool(sys.stdout.write_through or os.environ.get("PYTHONUNBUFFERED"))
env["executable"] = os.path.realpath(sys.executable)
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(env, f)
