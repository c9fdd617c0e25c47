"""One step of a dlrun_recovery.Recoverable program as a transaction (docs/RECOVERY.md, "A step
is whole or not at all"), and the digests the replicas are compared by. Internal to
dlrun_recovery (beside it on the workers' PYTHONPATH and in the wheel)."""
import copy
import hashlib
import random
import socket
import struct
import sys
import time

import torch
import torch.distributed as dist

from dlrun_group import Refused, is_comm_error


class StepUndo:
    """The undo record of one step (docs/RECOVERY.md, "A step is whole or not at all"): what the
    step may change, as it was before. At the step's start: the module's buffers (a forward
    updates BatchNorm's running statistics), the state of the objects after the optimizer (a
    scheduler, an EMA, a loss scaler), the optimizers' hyperparameters (a scheduler sets the
    learning rate) and the RNG; before each optimizer's update (its pre-hook): its parameters
    and its state. A step given up puts them back, so the survivors hold their last whole step,
    whatever the step did before the fault, after the update too."""

    def __init__(self, rec):
        self.rec = rec
        self.updates = 0
        self.buffers = [b.detach().clone() for b in rec.module.buffers()]
        self.stateful = [copy.deepcopy(s.state_dict()) for s in rec.stateful]
        self.hyper = [[{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                       for g in o.param_groups] for o in rec.optimizers]
        self.rng = rng_state(rec.device)
        self.before = []  # (optimizer, its parameters' copies or None, its state_dict's copy)
        # The step's batches from rec.loader() iterators, in the order drawn: a step given up
        # hands them back, so that the step done again trains on the same ones.
        self.drawn = []   # (the iterator, the batch)
        self.inputs = None  # the module's inputs at the step's first forward (references)
        self.rank0_buffers = None  # the buffers right after DDP's broadcast of rank 0's

    def before_update(self, optimizer, snapshot):
        if any(o is optimizer for o, _, _ in self.before):
            return  # a second update of it in the step: the copy from before the first holds
        if not snapshot:
            self.before.append((optimizer, None, None))
            return
        params = [p.detach().clone() for g in optimizer.param_groups for p in g["params"]]
        self.before.append((optimizer, params, copy.deepcopy(optimizer.state_dict())))

    def undo(self):
        rec = self.rec
        with torch.no_grad():
            for optimizer, params, state in self.before:
                if params is None:
                    raise RuntimeError(
                        "refused: the peer was lost after this step's optimizer update (step %d),"
                        " which Recoverable(snapshot=False) keeps no copy to undo"
                        % (rec.committed + 1))
                live = [p for g in optimizer.param_groups for p in g["params"]]
                for p, saved in zip(live, params):
                    p.copy_(saved)
                optimizer.load_state_dict(state)
            for b, saved in zip(rec.module.buffers(), self.buffers):
                b.copy_(saved)
        for o, groups in zip(rec.optimizers, self.hyper):
            for g, saved in zip(o.param_groups, groups):
                g.update(copy.deepcopy(saved))
        for s, sd in zip(rec.stateful, self.stateful):
            s.load_state_dict(sd)
        set_rng_state(self.rng)
        for it, batch in reversed(self.drawn):
            it.hand_back(batch)
        rec.updates -= self.updates
        for p in rec.module.parameters():
            p.grad = None


def rng_state(device):
    """Every random generator a step may draw from: torch's CPU one, the CUDA one of `device`,
    Python's `random` and numpy's global one (when the program imported numpy)."""
    state = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def set_rng_state(state):
    """Puts back what rng_state() read (CUDA: the current device's, as rng_state's device)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state and sys.modules.get("numpy") is not None:
        sys.modules["numpy"].random.set_state(state["numpy"])


RNG_NAMES = ("torch", "cuda", "random", "numpy")


def rng_digests(state):
    """Signed 64-bit digests of rng_state()'s generators, in RNG_NAMES' order (0: absent)."""
    out = []
    for name in RNG_NAMES:
        v = state.get(name)
        if v is None:
            out.append(0)
            continue
        h = hashlib.blake2b(digest_size=8)
        if isinstance(v, torch.Tensor):
            h.update(_bytes(v))
        elif name == "numpy":
            h.update(repr(v[0]).encode())
            h.update(v[1].tobytes())
            h.update(repr(v[2:]).encode())
        else:
            h.update(repr(v).encode())
        out.append(int.from_bytes(h.digest(), "little", signed=True))
    return out


def same_inputs(a, b):
    """Whether two forward inputs (lists of tensors and plain values) are the same, bit for bit."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
                return False
            if not torch.equal(x, y) and not _bytes(x) == _bytes(y):  # NaN != NaN
                return False
        elif x != y:
            return False
    return True


def flat_inputs(args, kwargs):
    """The tensors and plain values of a forward's arguments, in order."""
    out = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                walk(v[k])
        elif isinstance(v, (bool, int, float, str, type(None))):
            out.append(v)

    walk(args)
    walk(kwargs)
    return out


def digest(module):
    h = hashlib.blake2b(digest_size=8)
    for t in list(module.parameters()) + list(module.buffers()):
        h.update(_bytes(t))
    return int.from_bytes(h.digest(), "little", signed=True)


def _bytes(t):
    t = t.detach().cpu().reshape(-1).contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def named_digests(module, stateful=(), buffers=True):
    """(names, digests): one per parameter, buffer (unless not `buffers`), and tensor or number
    in the state of each object after the optimizer, in a fixed order."""
    names, digests = [], []

    def add(name, data):
        names.append(name)
        h = hashlib.blake2b(data, digest_size=8).digest()
        digests.append(int.from_bytes(h, "little", signed=True))

    for n, t in module.named_parameters():
        add("parameter %r" % n, _bytes(t))
    if buffers:
        for n, t in module.named_buffers():
            add("buffer %r" % n, _bytes(t))
    for i, s in enumerate(stateful):
        # A module's buffers (an AveragedModel's BatchNorm statistics) follow each rank's own
        # batches, as the model's do: not compared (docs/RECOVERY.md).
        own = set(own_buffers(s)) if not buffers else set()
        for key, v in _flat(s.state_dict()):
            if key in own:
                continue
            what = "state %r of %s (after the optimizer, #%d)" % (key, type(s).__name__, i + 1)
            if isinstance(v, torch.Tensor):
                add(what, _bytes(v))
            elif isinstance(v, (bool, int, float, str, type(None))):
                add(what, repr(v).encode())
    return names, digests


def own_buffers(obj):
    """The state_dict keys of a module's floating-point buffers (running statistics, each
    rank's own); none for an object that is not a module. Counters (an AveragedModel's
    n_averaged) stay: they are the same on every rank."""
    if not isinstance(obj, torch.nn.Module):
        return []
    return [n for n, b in obj.named_buffers() if b.is_floating_point()]


def _flat(d, prefix=""):
    if isinstance(d, dict):
        for k in sorted(d, key=str):
            yield from _flat(d[k], "%s%s%s" % (prefix, "." if prefix else "", k))
    elif isinstance(d, (list, tuple)):
        for i, v in enumerate(d):
            yield from _flat(v, "%s[%d]" % (prefix, i))
    else:
        yield prefix, d


def check_replicas(module, stateful, root, dev):
    """Collective: every rank must hold the same parameters and state of the objects after
    the optimizer, bit for bit; else one line naming the first that differs. Not the
    buffers: each rank's running statistics take in its own batch after DDP's broadcast
    (of rank 0's, at each forward), so they differ between ranks at the end of a step."""
    world = dist.get_world_size()
    names, digests = named_digests(module, stateful, buffers=False)
    # One gather of (count, a digest of the digests); the digests themselves only to name what
    # differs.
    summary = [torch.zeros(2, dtype=torch.int64, device=dev) for _ in range(world)]
    whole = hashlib.blake2b(struct.pack("<%dq" % len(digests), *digests), digest_size=8)
    dist.all_gather(summary, torch.tensor([len(digests), int.from_bytes(whole.digest(), "little",
                                                                        signed=True)],
                                          dtype=torch.int64, device=dev))
    summary = [t.tolist() for t in summary]
    if all(row == summary[0] for row in summary):
        return
    counts = [row[0] for row in summary]
    if len(set(counts)) > 1:
        raise RuntimeError("rank(s) %s hold %s tensors of state, rank 0 %d: not going on with "
                           "replicas that differ" % (",".join(str(r) for r, c in
                                                    enumerate(counts) if c != counts[0]),
                                                    "/".join(map(str, counts)), counts[0]))
    mine = torch.tensor(digests, dtype=torch.int64, device=dev)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    every = [t.tolist() for t in every]
    differ = [r for r in range(world) if every[r] != every[0]]
    if differ:
        first = next(i for i in range(len(names)) if every[differ[0]][i] != every[0][i])
        raise RuntimeError("rank(s) %s hold other values than rank 0 after the state transfer "
                           "from rank %d, first the %s: not going on with replicas that differ"
                           % (",".join(map(str, differ)), root, names[first]))


# DDP communication hooks (docs/RECOVERY.md, "Communication hooks"). Their state is either none
# or a process group (PyTorch's allreduce and compression hooks): the hook goes on with the
# new group after a recovery. Any other state (PowerSGD's error feedback, a user's) is the
# rank's own, not sent by the transfer: a recovery with it is refused.
def comm_hooks(ddp):
    """[(hook, state)] registered on `ddp` (DistributedDataParallel's own list)."""
    return list(getattr(ddp, "_comm_hooks", []) or [])


def describe_hooks(hooks):
    """How the hooks are told apart across ranks: each hook's name and its state's type ("a
    process group" for a group or None, the default group: the same after a recovery)."""
    return [("%s.%s" % (getattr(h, "__module__", "?"), getattr(h, "__qualname__", repr(h))),
             "a process group" if s is None or isinstance(s, dist.ProcessGroup)
             else type(s).__name__) for h, s in hooks]


def check_comm_hooks(ddp):
    """Collective, once before the first step: every rank has the same hooks (name and state
    type), else one line naming the ranks and hooks (a hook on some ranks only reduces
    differently and hangs). Returns a refusal (str) for a hook whose state the transfer would
    not carry, or None."""
    mine = describe_hooks(comm_hooks(ddp))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    differ = [r for r, h in enumerate(every) if h != every[0]]
    if differ:
        raise RuntimeError("the DDP communication hooks differ across ranks: rank 0 has %s; %s; "
                           "every rank must register the same hook (register_comm_hook) before "
                           "its first step" % (_hooks_text(every[0]), "; ".join(
                               "rank %d has %s" % (r, _hooks_text(every[r])) for r in differ)))
    for name, state in mine:
        if state != "a process group":
            return ("the DDP communication hook %s keeps state of its own (%s), which the state "
                    "transfer does not send" % (name, state))
    return None


def _hooks_text(hooks):
    return ", ".join("%s (state %s)" % h for h in hooks) if hooks else "none"


def carry_comm_hooks(hooks, ddp):
    """The hooks of the DDP a recovery replaced, on the new one: a process group in their state
    was the old generation's, so the new default group (None) takes its place."""
    for hook, state in hooks:
        ddp.register_comm_hook(None if isinstance(state, dist.ProcessGroup) else state, hook)


def await_store(host, port, timeout):
    """Waits until rank 0 listens on its new store's port: TCPStore's own client, refused,
    backs off for up to a second, and rank 0 makes its store only once it has heard the word."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.005)


def exit_now(code=1):
    """Ends the process after an uncaught exception, as Python's exit would but without its
    teardown: the program's atexit functions run and the files it left open are flushed, then
    os._exit. The teardown of an interpreter holding torch and a process group takes ~0.75 s
    (bench/RESULTS.md), and the agent sees the failure (the survivors wait) only once the
    process is gone."""
    import atexit
    import gc
    import io
    import os
    # Work that only undoes this process' own memory, which is about to go: the fork server's
    # gc.unfreeze (then the scan below would walk, and copy, every object the server imported:
    # 0.24 s) and torch.library's ~190 finalizers that unregister operators (0.07 s).
    atexit.unregister(gc.unfreeze)
    _detach_torch_library_finalizers()
    try:
        atexit._run_exitfuncs()
    except Exception:
        pass
    buffered = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    for obj in gc.get_objects():  # the fork server froze its own: the program's objects only
        if type(obj) in buffered:  # (not isinstance: ABCMeta's check is slow on every object)
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _detach_torch_library_finalizers():
    import weakref
    lib = sys.modules.get("torch.library")
    undo = getattr(lib, "_del_library", None)
    if undo is None:
        return
    for f, info in list(weakref.finalize._registry.items()):
        if info.func is undo:
            f.detach()


class Step:
    """`with rec.step() as s:` (dlrun_recovery.Recoverable.step): `s.number` is the step,
    `s.committed` whether it was done (false after the block when a peer was lost in it: steps()
    yields it again)."""

    def __init__(self, rec):
        self.rec = rec
        self.number = None
        self.committed = False

    def __enter__(self):
        rec = self.rec
        rec._regroup_if_told()  # a loop of the program's own, without rec.steps()
        rec._current = rec.committed + 1
        self.number = rec._current
        if rec._last_raw is not None:  # `for batch in loader:` around the step
            rec._raw_loader, rec._last_raw = True, None
        if not rec._hooks_checked:  # collective: before any rank's first hooked backward
            rec._refusal = rec._refusal or check_comm_hooks(rec.ddp)
            rec._hooks_checked = True
        rec._txn = StepUndo(rec) if rec._words is not None else None
        if rec._txn is not None:
            for l in rec._loaders:
                l.into_step(rec._txn)
        return self

    def __exit__(self, kind, value, tb):
        rec = self.rec
        txn, rec._txn = rec._txn, None
        if kind is None:
            rec.committed = rec._current
            self.committed = True
            if txn is not None:
                for it, _ in txn.drawn:
                    it.committed += 1
                now = rng_state(rec.device)
                digests = rng_digests(now)
                rec._rng_used = [u or a != b for u, a, b in zip(
                    rec._rng_used, digests, rec._rng_commit_digests)]
                rec._rng_commit, rec._rng_commit_digests = now, digests
            # Gradients left without an update carry into the next step: state no transfer sends.
            rec._grads_left = (txn is not None and txn.updates == 0 and
                               any(p.grad is not None for p in rec.module.parameters()))
            return False
        if not isinstance(value, Exception) or rec._words is None or isinstance(value, Refused):
            return False
        if not (rec._words.interrupted() or is_comm_error(value)):
            return False  # the program's own error: a failure now, not after a wait for a word
        return rec._give_up(value, txn)
