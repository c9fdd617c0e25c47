# Run by tests/multiproc/dlrun_agent_test.cc under dlrun and under torchrun: a plain
# torch.distributed program with env:// init, recording what it saw.
import os, sys, json, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env:// init: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ["RANK","LOCAL_RANK","WORLD_SIZE","LOCAL_WORLD_SIZE","GROUP_RANK","ROLE_RANK","ROLE_NAME","GROUP_WORLD_SIZE","ROLE_WORLD_SIZE","TORCHELASTIC_RESTART_COUNT","TORCHELASTIC_MAX_RESTARTS","TORCHELASTIC_USE_AGENT_STORE","MASTER_ADDR"]
out = {k: os.environ.get(k) for k in keys}
out["allreduce"] = t.item(); out["rank"] = dist.get_rank(); out["world"] = dist.get_world_size()
# What the process itself looks like (dlrun forks Python workers from a server that imported
# torch: each must still be its own, as a fresh interpreter is): the script as __main__, its
# argv and path, the parent (the launcher's agent), and generators seeded per process.
import random, signal, threading, numpy
script = os.path.realpath(__file__)
out.update(name=__name__, argv=sys.argv[1:] == [sys.argv[1]], file=__file__ == script,
           path0=sys.path[0] == os.path.dirname(script), sigint=str(signal.getsignal(signal.SIGINT)),
           threads=threading.active_count(), affinity=sorted(os.sched_getaffinity(0)),
           parent_is_launcher=any(a.endswith(b"dlrun") or a in (b"torch.distributed.run", b"torchrun")
                                  for a in open("/proc/%d/cmdline" % os.getppid(), "rb").read().split(b"\0")),
           numpy_draw=numpy.random.random(), random_draw=random.random())
with open(os.path.join(sys.argv[1], "rank%d.json" % dist.get_rank()), "w") as f: json.dump(out, f)
dist.destroy_process_group()
