"""The state transfer of dlrun_recovery (docs/RECOVERY.md, "Python programs"): after a new group
is made, the ranks agree on the newest whole step, refuse in one line what cannot be made exact,
and the lowest rank holding that step sends its state to every rank behind it. Internal to
dlrun_recovery (beside it on the workers' PYTHONPATH and in the wheel)."""
import io
import sys

import torch
import torch.distributed as dist

from dlrun_group import bucket_layout
from dlrun_step import RNG_NAMES, check_replicas, own_buffers, rng_digests, rng_state, set_rng_state

# The columns of each rank's row in the agreement (one allgather).
_STEP, _UPDATES, _GRADS_LEFT, _REFUSES, _RNG, _RNG_PER_RANK, _RANK0_BUFFERS, _LAYOUT = range(8)


def transfer(rec, replacement=False):
    """Collective: the lowest rank with the newest committed step sends its state to every
    rank behind it (a replacement is behind every survivor: a fault before the first step
    sends the state the survivors started with), with its DDP bucket layout; a rank not
    behind keeps its own layout when it is the sender's (compared by digest in the gather),
    else the sender broadcasts it. Then every rank must hold the same parameters. Returns the
    sender. Collectives in the usual case: the gather, the state sent (size, then bytes) and
    the replicas' check."""
    refusal = None if replacement else rec._refusal_now()
    own = None if replacement else bucket_layout(rec.ddp)
    rows = _gather(rec, replacement, refusal, own)
    held = [row[_STEP] for row in rows]
    best = max(held)
    root = held.index(best)
    behind = [r for r in range(len(rows)) if held[r] < best]
    _check(rec, rows, best, root, behind, refusal)
    rank = dist.get_rank()
    if rank in behind:
        own = None  # set from the state it receives
    if any(row[_LAYOUT] != rows[root][_LAYOUT] for r, row in enumerate(rows) if r not in behind):
        layout = [own if rank == root else None]  # a survivor's rebuild differs: rare
        dist.broadcast_object_list(layout, src=root, device=rec.device)
        own = layout[0]
    rec._peer_layout = own
    _exchange(rec, root, behind, best, replacement)
    check_replicas(rec.module, rec.stateful, root, rec.device)
    rec.committed = best
    rec.updates = rows[root][_UPDATES]
    rec._grads_left = False
    rec._rank0_buffers = None
    return root


def _gather(rec, replacement, refusal, layout):
    """Each rank's last whole step, its optimizer updates by then, whether gradients were left
    over from it without an update, whether its program refuses, its random generators that
    were equal across ranks (digest), whether its steps drew from one seeded per rank, and the
    step whose rank-0 buffers it holds (from DDP's broadcast in the step given up), and its
    DDP bucket layout's digest (`layout`; -1: none)."""
    dev = rec.device
    mine = torch.tensor([-2 if replacement else rec.committed, rec.updates,
                         int(rec._grads_left), int(refusal is not None),
                         _shared_digest(rec._rng_commit_digests, rec._rng_shared),
                         int(any(u and not sh for u, sh in zip(rec._rng_used, rec._rng_shared))),
                         rec._rank0_buffers[0] if rec._rank0_buffers else -3,
                         _layout_digest(layout)],
                        dtype=torch.int64, device=dev)
    rows = [torch.zeros(8, dtype=torch.int64, device=dev) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [[int(v) for v in t.tolist()] for t in rows]


def _check(rec, rows, best, root, behind, refusal):
    """Raises RuntimeError("refused: RULE") for what the transfer cannot make exact."""
    if best < -1:
        raise RuntimeError("no rank holds a state to send")
    refusing = [str(r) for r, row in enumerate(rows) if row[_REFUSES]]
    if refusing:
        raise RuntimeError("refused: " + (refusal or "rank(s) %s cannot recover exactly (their "
                                          "lines say why)" % ",".join(refusing)))
    if rows[root][_GRADS_LEFT]:
        raise RuntimeError("refused: step %d ended with gradients and no optimizer update "
                           "(accumulated across steps, or an update skipped): gradients are "
                           "not part of the state sent; one rec.step() per update makes it "
                           "whole" % best)
    per_rank = [str(r) for r, row in enumerate(rows) if row[_RNG_PER_RANK]]
    if behind and per_rank:
        names = [n for n, sh in zip(RNG_NAMES, rec._rng_shared) if not sh]
        raise RuntimeError("refused: a random generator differs across ranks (%s: seeded per "
                           "rank?) and rank(s) %s drew from it in their steps: rank(s) %s "
                           "cannot be given the lost one's" % (
                               "/".join(names) or "?", ",".join(per_rank),
                               ",".join(map(str, behind))))
    if behind and len({row[_RNG] for row in rows if row[_STEP] >= -1}) > 1:
        raise RuntimeError("refused: the survivors' random generators differ (seeded once, "
                           "then drawn from unevenly?): the lost rank's cannot be known")
    buffers = [n for n, _ in rec.module.named_buffers()]
    if buffers and best >= 0 and 0 in behind:
        if not rec.broadcast:
            raise RuntimeError("refused: rank 0 was lost, and with it the module's buffers as of "
                               "step %d (%r...: its own running statistics, DDP's "
                               "broadcast_buffers off): no other rank holds them"
                               % (best, buffers[0]))
        if rows[root][_RANK0_BUFFERS] != best:
            raise RuntimeError(
                "refused: rank 0 was lost, and with it the module's buffers as of step %d "
                "(%r...: running statistics, which DDP broadcasts from rank 0 at each "
                "forward): rank %d did not hold them (the fault came before the step's "
                "broadcast)" % (best, buffers[0], root))
    counts = [str(r) for r, row in enumerate(rows)
              if row[_STEP] == best and row[_UPDATES] != rows[root][_UPDATES]]
    if counts:
        raise RuntimeError("refused: rank(s) %s applied another number of optimizer updates "
                           "by step %d than rank %d (%d): an update outside the step, or one "
                           "applied twice" % (",".join(counts), best, root,
                                              rows[root][_UPDATES]))


def _exchange(rec, root, behind, best, replacement):
    """The sender's state, point to point, to every rank behind; each receiver loads it."""
    rank, dev = dist.get_rank(), rec.device
    if rank == root:
        buf = io.BytesIO()
        rank0_buffers = rec._rank0_buffers[1] if 0 in behind and rec._rank0_buffers else None
        rec._sending = True
        try:
            torch.save({"model": rec.module.state_dict(),
                        "optimizers": [o.state_dict() for o in rec.optimizers],
                        "stateful": [s.state_dict() for s in rec.stateful],
                        "rng": rec._rng_commit, "rng_shared": rec._rng_shared,
                        "loaders": [l.position() for l in rec._loaders],
                        "epoch": rec._epoch, "rank0_buffers": rank0_buffers,
                        "layout": rec._peer_layout}, buf)
        finally:
            rec._sending = False
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(dev)
        for r in behind:
            dist.send(torch.tensor([data.numel()], dtype=torch.int64, device=dev), r)
            dist.send(data, r)
    elif rank in behind:
        n = torch.zeros(1, dtype=torch.int64, device=dev)
        dist.recv(n, root)
        data = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
        dist.recv(data, root)
        state = torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=False,
                           map_location=dev if dev.type == "cuda" else None)
        _load(rec, state, root, replacement)
    buffers = [n for n, _ in rec.module.named_buffers()]
    if buffers and rank in behind and not rec.broadcast:
        print("dlrun_recovery: rank %d: its buffers (%r...), its own with DDP's "
              "broadcast_buffers off, were lost with its process: it goes on with rank %d's"
              % (rank, buffers[0], root), file=sys.stderr, flush=True)


def _load(rec, state, root, replacement):
    rank = dist.get_rank()
    rec.module.load_state_dict(state["model"])
    rec._peer_layout = state["layout"]
    for o, sd in zip(rec.optimizers, state["optimizers"]):
        o.load_state_dict(sd)
    for s, sd in zip(rec.stateful, state["stateful"]):
        s.load_state_dict(sd)
    if state["rank0_buffers"] is not None and rank == 0:
        with torch.no_grad():
            for b, v in zip(rec.module.buffers(), state["rank0_buffers"]):
                b.copy_(v)
    mine = rng_state(rec.device)  # a generator that differs across ranks stays this rank's own
    sent = {n: (v if state["rng_shared"][RNG_NAMES.index(n)] else mine.get(n))
            for n, v in state["rng"].items()}
    sent = {n: v for n, v in sent.items() if v is not None}
    set_rng_state(sent)
    rec._rng_commit, rec._rng_commit_digests = sent, rng_digests(sent)
    rec._rng_shared = list(state["rng_shared"])
    if replacement:
        rec._positions = list(state["loaders"])
        rec._epoch = state["epoch"]
    else:  # the batches of the step it gave up count as drawn: it goes on after it
        for l in rec._loaders:
            l.skip_handed_back()
    own = [type(s).__name__ for s in rec.stateful if own_buffers(s)]
    if own:
        print("dlrun_recovery: rank %d: the running statistics of its %s (each rank's own) were "
              "lost with its process: it goes on with rank %d's" % (rank, ", ".join(own), root),
              file=sys.stderr, flush=True)


def _layout_digest(layout):
    """A digest of a DDP bucket layout (a list of parameter indices; None: -1), the same in
    every process (Python hashes ints and tuples of them without a per-process seed)."""
    return -1 if layout is None else hash(tuple(layout)) & (2 ** 63 - 1)


def _shared_digest(digests, shared):
    """One digest of the generators that were equal across ranks (for the survivors' check)."""
    return hash(tuple(d for d, sh in zip(digests, shared) if sh)) & (2 ** 63 - 1)
