"""Writes what this rank sees to OUT_DIR/<RANK>.json: its whole environment under "env", and
whether torch.cuda.set_device(int(LOCAL_RANK)) would find its device and how Python runs."""
import json
import os
import sys

visible = [d for d in (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d]
probe = {
    "env": dict(os.environ),
    "set_device_local_rank_ok": int(os.environ["LOCAL_RANK"]) < len(visible),
    "unbuffered": bool(sys.stdout.write_through or os.environ.get("PYTHONUNBUFFERED")),
    "executable": os.path.realpath(sys.executable),
}
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(probe, f)
