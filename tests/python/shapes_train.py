"""The conformance sweep's program (tests/multiproc/recovery_shapes_test.cc; docs/RECOVERY.md, "A
step is whole or not at all"): a 2-rank gloo DDP trainer in one of the shapes users write, with
dlrun_recovery, killed at every point of a step, one point after another in the same run.

usage: shapes_train.py SHAPE STEPS
SHAPE: one of SHAPES below (a program's shape: BatchNorm with DDP's broadcast_buffers on or
off, a logging all-reduce after the update, an EMA, gradient accumulation, clipping, AMP's
loss scaler skipping a step, two optimizers, an LR schedule, the model called directly beside
the wrapper, an update outside the step, DDP's fp16 compression hook, PowerSGD's hook with its
error feedback, a hook on rank 1 only; Dropout seeded once; a DataLoader iterator kept across
steps, with 0 or 2 loader workers, given to rec.loader() ("loader0", "loader2") or not
("raw_loader": refused, the checkpoint); a barrier and a checkpoint after the step's block; an
exception raised in a step (a failure at once, replaced in process); DDP's find_unused_parameters
with a branch never used or used every third step (refused at once, the checkpoint); BatchNorm with an AveragedModel EMA
of its statistics; gradient accumulation with each micro-batch in a step of its own (refused
after a micro-step, the checkpoint); a bug that the step done again meets on the other rank,
alternately (the job ends with a verdict)).
KILLS=STEP:RANK:POINT,...  the first process of RANK SIGKILLs itself at POINT of STEP (once per
run: a marker in CKPT_DIR): start (before the forward), backward (in a gradient's hook),
update (right after the optimizer's update, before the step's next collective), commit (after
the step, before the next); "raise": raises a ValueError at the step's start instead; "sleep":
sleeps there for an hour (a hung rank).
CKPT_DIR: rank 0 writes a checkpoint (atomically) every 4 steps; a start that is not a
replacement resumes from it ("resumed from step S"): the fall-back after a refusal.
Lines: "rank R digest D buffers B recoveries K" at the end: D over every parameter and the
state after the optimizer (the EMA, the scaler, the schedule), B over the module's buffers.
"""
import os
import signal
import sys

import torch
import torch.distributed as dist

import dlrun_recovery
import dlrun_report
import dlrun_step

SHAPES = ("plain", "bn", "bn_nobcast", "log_allreduce", "ema", "accumulate", "clip", "amp_skip",
          "two_optimizers", "schedule", "direct_call", "update_outside", "comm_hook", "powersgd",
          "hook_one_rank", "dropout", "loader0", "loader2", "raw_loader", "ckpt_barrier",
          "exception", "unused_never", "unused_third", "ema_bn", "micro_steps", "bug")
shape, steps = sys.argv[1], int(sys.argv[2])
if shape not in SHAPES:
    sys.exit("shapes_train.py: unknown shape %r (expected one of %s)" % (shape, ", ".join(SHAPES)))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
bn = shape in ("bn", "bn_nobcast", "direct_call", "ema_bn")
layers = [torch.nn.Linear(8, 16)]
if bn:
    layers.append(torch.nn.BatchNorm1d(16))
layers += [torch.nn.ReLU(), torch.nn.Linear(16, 1)]
if shape in ("dropout", "loader0", "loader2"):  # the loader shapes too: the iterator's seed draw
    layers.insert(2, torch.nn.Dropout(0.3))
model = torch.nn.Sequential(*layers)
if shape in ("unused_never", "unused_third"):  # a branch no step uses, or every third step:
    # DDP must be told to look for it


    class WithBranch(torch.nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body, self.branch = body, torch.nn.Linear(8, 1)
            self.use_branch = False

        def forward(self, x):
            return self.body(x) + self.branch(x) if self.use_branch else self.body(x)


    model = WithBranch(model)
if shape == "two_optimizers":
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.05, momentum=0.9),
            torch.optim.Adam(model[2].parameters(), lr=1e-2)]
else:
    opts = [torch.optim.AdamW(model.parameters(), lr=1e-2)]
stateful = []
if shape == "ema_bn":  # the EMA of the parameters and of each rank's own running statistics
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9), use_buffers=True)
    stateful.append(ema)
if shape == "schedule":
    stateful.append(torch.optim.lr_scheduler.LambdaLR(opts[0], lambda s: min(1.0, (s + 1) / 5)))
ema = stateful[0] if shape == "ema_bn" else None
if shape == "ema":
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    stateful.append(ema)
scaler = None
if shape == "amp_skip":
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=3)
    stateful.append(scaler)

ckpt_dir = os.environ["CKPT_DIR"]
path = os.path.join(ckpt_dir, "latest.pt")
start = 0
state = None
if os.path.exists(path) and not dlrun_recovery.is_replacement():
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    for o, sd in zip(opts, state["optimizers"]):
        o.load_state_dict(sd)
    for s, sd in zip(stateful, state["stateful"]):
        s.load_state_dict(sd)
    start = state["step"] + 1
    print("rank %d resumed from step %d" % (rank, state["step"]), flush=True)

ddp_kwargs = {"broadcast_buffers": False} if shape == "bn_nobcast" else {}
if shape in ("unused_never", "unused_third"):
    ddp_kwargs = {"find_unused_parameters": True}
rec = dlrun_recovery.Recoverable(model, opts if len(opts) > 1 else opts[0], *stateful,
                                 ddp=ddp_kwargs)
if shape in ("comm_hook", "hook_one_rank") and (shape == "comm_hook" or rank == 1):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    rec.ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
hook_state = None
if shape == "powersgd":  # its error feedback is in the checkpoint, as a resume must have it
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    hook_state = (state or {}).get("hook") or powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    rec.ddp.register_comm_hook(hook_state, powerSGD_hook.powerSGD_hook)
kills = {}
for k in filter(None, os.environ.get("KILLS", "").split(",")):
    s, r, point = k.split(":")
    kills[(int(s), point)] = int(r)


def kill_here(step, point):
    if kills.get((step, point)) != rank:
        return
    marker = os.path.join(ckpt_dir, "killed-%d-%s" % (step, point))
    if os.path.exists(marker):
        return
    open(marker, "w").close()
    if point == "raise":  # an error of the program's own (an OOM, a bug) in the step
        raise ValueError("an error of the program's own in step %d" % step)
    if point == "sleep":  # hung: the hang detection must name it, then it is killed
        print("rank %d hangs in step %d" % (rank, step), flush=True)
        import time
        time.sleep(3600)
    print("rank %d killed at step %d, %s" % (rank, step, point), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def batch(step, micro=0):
    g = torch.Generator().manual_seed(10000 * step + 100 * rank + micro)
    x = torch.randn(8, 8, generator=g)
    return x, x.sum(1, keepdim=True).tanh()


current = [0]
loader = None
if shape in ("loader0", "loader2", "raw_loader"):  # a DataLoader's iterator, kept across steps
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = torch.Generator().manual_seed(7)
    xs = torch.randn(64 * dist.get_world_size(), 8, generator=g)
    data = TensorDataset(xs, xs.sum(1, keepdim=True).tanh())
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=8, sampler=sampler,
                        num_workers=2 if shape == "loader2" else 0)
    per_epoch = len(loader)  # 8 batches an epoch
    if shape != "raw_loader":
        loader = rec.loader(loader)
for o in opts:
    o.register_step_post_hook(lambda *a: kill_here(current[0], "update"))
hooked = next(model.parameters())
hooked.register_hook(lambda g: (kill_here(current[0], "backward"), g)[1])
os.makedirs(ckpt_dir, exist_ok=True)
def steps_and_batches():
    """(step, batch or None): rec.steps(), or for the loader shapes an epoch loop over the
    loader's iterator, kept across steps, the step numbers following."""
    if loader is None:
        for step in rec.steps(steps, start=start):
            yield step, None
        return
    epochs = (steps + per_epoch - 1) // per_epoch
    rec.resume(start - 1)  # the checkpoint's step (rec.steps(start=) says it for the others)
    for epoch in rec.epochs(epochs, start=start // per_epoch):
        sampler.set_epoch(epoch)
        it = iter(loader)
        if epoch == start // per_epoch and not rec.replacement:  # resumed mid-epoch
            for _ in range(start % per_epoch):
                next(it)
        for b in it:
            if rec.committed + 1 >= steps:
                return
            yield rec.committed + 1, b


for step, given in steps_and_batches():
    current[0] = step
    if shape == "unused_third":
        model.use_branch = step % 3 == 0
    with rec.step() as st:
        kill_here(step, "start")
        kill_here(step, "raise")
        kill_here(step, "sleep")
        if shape == "bug" and step == 6 and (rank == 0 and rec.recoveries > 0 or
                                             rank == 1 and not rec.replacement):
            raise ValueError("a bug met in step 6 (rank %d)" % rank)
        if shape != "micro_steps" or step % 2 == 0:
            for o in opts:
                o.zero_grad()
        if shape == "micro_steps":  # a step per micro-batch: the update every second step
            x, y = batch(step)
            if step % 2 == 0:
                with rec.ddp.no_sync():
                    (torch.nn.functional.mse_loss(rec.ddp(x), y) / 2).backward()
            else:
                (torch.nn.functional.mse_loss(rec.ddp(x), y) / 2).backward()
            loss = None
        elif shape == "accumulate":  # two micro-batches, one update: the sum only on the last
            with rec.ddp.no_sync():
                x, y = batch(step, 0)
                (torch.nn.functional.mse_loss(rec.ddp(x), y) / 2).backward()
            x, y = batch(step, 1)
            loss = torch.nn.functional.mse_loss(rec.ddp(x), y) / 2
        elif given is not None:
            x, y = given
            loss = torch.nn.functional.mse_loss(rec.ddp(x), y)
        else:
            x, y = batch(step)
            loss = torch.nn.functional.mse_loss(rec.ddp(x), y)
        if shape == "direct_call":  # the plain module beside the wrapper: its BatchNorm counts too
            with torch.no_grad():
                model(batch(step, 7)[0])
        if scaler is not None:
            if step % 5 == 3:
                loss = loss * float("inf")  # the scaler skips this step's update
            scaler.scale(loss).backward()
            scaler.step(opts[0])
            scaler.update()
        else:
            if loss is not None:
                loss.backward()
            if shape == "clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            if shape != "update_outside" and (shape != "micro_steps" or step % 2 == 1):
                for o in opts:
                    o.step()
        if ema is not None:
            ema.update_parameters(model)
        for s in stateful:
            if isinstance(s, torch.optim.lr_scheduler.LRScheduler):
                s.step()
        if shape in ("log_allreduce", "ema"):  # the loss for the log, summed after the update
            logged = loss.detach().clone()
            dist.all_reduce(logged)
        if scaler is not None:
            for o in opts:
                o.zero_grad(set_to_none=True)
    if shape == "update_outside":  # the update after the step's block: refused, never doubled
        for o in opts:
            o.step()
    if not st.committed:
        continue  # given up (a peer lost in it): done again next
    dlrun_report.report_step(step, samples=8, step_s=0.0)
    kill_here(step, "commit")
    if shape == "ckpt_barrier" and (step + 1) % 4 == 0:
        dist.barrier()  # every rank at the step before rank 0 saves, as most scripts do
    if rank == 0 and (step + 1) % 4 == 0:
        torch.save({"model": model.state_dict(), "optimizers": [o.state_dict() for o in opts],
                    "stateful": [s.state_dict() for s in stateful], "step": step,
                    "hook": hook_state}, path + ".tmp")
        os.replace(path + ".tmp", path)

def digest(values):
    return "%016x" % (hash(tuple(values)) & (2 ** 64 - 1))


params = dlrun_step.named_digests(model, stateful, buffers=False)[1]
buffers = dlrun_step.named_digests(model)[1][len(list(model.parameters())):]
print("rank %d digest %s buffers %s recoveries %d" % (rank, digest(params), digest(buffers),
                                                     rec.recoveries), flush=True)
dist.destroy_process_group()
dlrun_report.done()  # a crash in the teardown after this is no failure (docs/USAGE.md, Done)
