# Run by tests/multiproc/dlrun_agent_test.cc under dlrun and under torchrun: a plain
# torch.distributed program with env:// init, recording what it saw.
import os, sys, json, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env:// init: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ["RANK","LOCAL_RANK","WORLD_SIZE","LOCAL_WORLD_SIZE","GROUP_RANK","ROLE_RANK","ROLE_NAME","GROUP_WORLD_SIZE","ROLE_WORLD_SIZE","TORCHELASTIC_RESTART_COUNT","TORCHELASTIC_MAX_RESTARTS","TORCHELASTIC_USE_AGENT_STORE","MASTER_ADDR"]
out = {k: os.environ.get(k) for k in keys}
out["allreduce"] = t.item(); out["rank"] = dist.get_rank(); out["world"] = dist.get_world_size()
with open(os.path.join(sys.argv[1], "rank%d.json" % dist.get_rank()), "w") as f: json.dump(out, f)
dist.destroy_process_group()
