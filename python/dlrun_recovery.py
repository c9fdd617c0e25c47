"""In-process recovery for torch.distributed programs run by dlrun (docs/RECOVERY.md, "A fault
costs one step"): when a rank dies, the others keep their processes, dlrun starts the lost rank
again, and it takes the state from a survivor; at most the interrupted step is done again, and
no checkpoint is read.

    import dlrun_recovery
    dist.init_process_group("gloo")
    rec = dlrun_recovery.Recoverable(model, optimizer, scheduler)   # builds rec.ddp
    for step in rec.steps(total, start=first_step):   # a replacement starts where its peers are
        with rec.step():                              # a peer lost inside: the step again
            loss = loss_fn(rec.ddp(inputs(step)), targets(step))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
    dist.destroy_process_group()
    dlrun_report.done()    # last: a crash in the interpreter's teardown is then no failure

`model` is the plain module: Recoverable wraps it in DistributedDataParallel (keyword arguments
in `ddp=`) and wraps it again after a recovery, so use `rec.ddp` each step, not a copy of it.
`optimizer` may be a list. A step is whole or not at all (dlrun_step.py; docs/RECOVERY.md): a
step given up is undone on the survivors, after the update too; what cannot be made exact is
refused in one line, and the group restarts from the checkpoint.
The objects after the optimizer (an LR scheduler, a sampler, anything with state_dict() and
load_state_dict()) travel with the model and optimizer to the replacement. A step's data must
follow from the step number (and the rank), as with a DistributedSampler and set_epoch.

A node lost from a job started with `--nnodes MIN:MAX` (every node's workers using this): the
survivors go on at the smaller world size in the same way, each with its new rank (RANK,
WORLD_SIZE and MASTER_ADDR in os.environ and `rec.rank` follow; a DistributedSampler made anew
from them, or one that reads dist.get_rank()/get_world_size() each epoch, follows too).

How it works (docs/RECOVERY.md): dlrun's agent writes the new generation and port (and a node's
loss, the new place) on DLRUN_CONTROL_FD; a thread here shuts the group's connections at once
(import this before init_process_group), the step's exception is caught and the step undone, the
group made again, the newest state sent to every rank behind, the replicas compared, and the
step done again. DDP communication hooks (rec.ddp.register_comm_hook) must match across ranks
and go on to the new wrapper. A recovery that cannot finish raises, and dlrun restarts the group
from the checkpoint. Outside dlrun, or with `--recovery restart`, nothing of this runs.

NCCL (CUDA tensors, `init_process_group("nccl")`): the word aborts the communicator at once
(ProcessGroup.abort(): ncclCommAbort, which ends the kernels waiting on the lost peer), the
step's optimizer update waits for the step's collectives and gives the step up if the word came
meanwhile or PyTorch saw the group fail (a summed gradient missing a peer is never applied), and
the transfer runs on the GPU. Importing this under dlrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING=0
unless the user set it (dlrun's own default is torchrun's 1): PyTorch's watchdog would otherwise
abort the group at the lost peer's error, and end the process before the group is rebuilt.
"""
import datetime
import gc
import io
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dlrun_report
from dlrun_step import (StepUndo as _Txn, await_store as _await_store, carry_comm_hooks,
                        check_comm_hooks, check_replicas, comm_hooks, digest as _digest)

if "DLRUN_CONTROL_FD" in os.environ:
    if os.environ.get("DLRUN_NCCL_ERROR_HANDLING_DEFAULT") == "1":  # dlrun's "1", not the user's
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
        os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "0"
    else:
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")


class _Words:
    """The agent's words on DLRUN_CONTROL_FD, read by a daemon thread."""

    def __init__(self, fd):
        self.cond = threading.Condition()
        self.newest = None  # (generation, master_port, place): place (rank, world, addr) or None
        self.taken = 0      # the generation this process has joined
        self.heard = 0      # the newest generation heard of, set before the old group is ended
        self.group_sockets = {}  # {inode: fd}: the connections of the current process group
        self.nccl_group = None   # the current group when it runs NCCL: aborted at the word
        threading.Thread(target=self._read, args=(fd,), daemon=True,
                         name="dlrun-words").start()

    def _read(self, fd):
        with os.fdopen(fd, "rb", buffering=0) as f:
            for line in iter(f.readline, b""):
                parts = line.decode(errors="replace").split()
                if (len(parts) not in (3, 6) or parts[0] != "regroup"
                        or not all(p.isdigit() for p in parts[1:5])):
                    continue  # another word: a newer agent's
                gen, port = int(parts[1]), int(parts[2])
                place = (int(parts[3]), int(parts[4]), parts[5]) if len(parts) == 6 else None
                with self.cond:
                    if gen <= self.taken or (self.newest and gen <= self.newest[0]):
                        continue
                    sockets = dict(self.group_sockets)
                    nccl = self.nccl_group
                    # Before the abort: an NCCL sum it ends returns as if done (interrupted()).
                    self.heard = max(self.heard, gen)
                # Before the main thread hears of it: it makes the next group's sockets, whose
                # fds may be those of the old group's just closed.
                _end_group(sockets)
                if nccl is not None:
                    _abort_nccl(nccl)
                with self.cond:
                    self.newest = (gen, port, place)
                    self.cond.notify_all()

    def pending(self):
        with self.cond:
            return self.newest if self.newest and self.newest[0] > self.taken else None

    def interrupted(self):
        """A word came for a generation not joined yet: the group's collectives since may have
        been ended by its abort, with partial sums."""
        with self.cond:
            return self.heard > self.taken

    def wait(self, timeout):
        with self.cond:
            self.cond.wait_for(lambda: self.newest and self.newest[0] > self.taken, timeout)
        return self.pending()


def _end_group(sockets):
    """Every collective of the current group ends in an error at once, also one waiting on a
    live peer that waits on the lost one (it would wait for Gloo's timeout; ProcessGroupGloo's
    abort() does not end a wait of DDP's reducer): its connections are shut down under it. The
    main thread aborts and forgets the group once its step has failed. Listening sockets are left
    alone (Gloo's listener aborts the process on a failed accept)."""
    open_now = dlrun_report._tcp_sockets()
    for inode, fd in sockets.items():
        if open_now.get(inode) != fd:
            continue  # closed meanwhile, its fd maybe reused
        try:
            s = socket.socket(fileno=os.dup(fd))
            s.shutdown(socket.SHUT_RDWR)
            s.close()
        except OSError:
            pass


def _abort_nccl(group):
    """ncclCommAbort on the group's communicators: a kernel waiting on the lost peer ends, and
    the main thread's wait on it with it."""
    try:
        group.abort()
    except Exception as e:  # an abort that fails leaves the recovery's own bound to end it
        print("dlrun_recovery: aborting the NCCL group: %s" % e, file=sys.stderr, flush=True)


def _nccl_failed(group):
    """True when PyTorch's watchdog saw the NCCL group fail (a lost peer, a timeout): its last
    sums may have been ended under it, whoever aborted them."""
    try:
        err = group._get_backend(torch.device("cuda")).get_error()
        return err != type(err).SUCCESS
    except Exception:  # a PyTorch without ProcessGroupNCCL.get_error: the word alone tells
        return False


def _device(backend):
    """Where the recovery's own collectives put their tensors: the GPU for NCCL."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _group_sockets(before):
    """The TCP connections made since `before` (a dlrun_report._tcp_sockets())."""
    return {i: fd for i, fd in dlrun_report._tcp_sockets().items() if i not in before}


class Recoverable:
    """A DDP model, its optimizer and state that survive the loss of a rank (module docstring)."""

    def __init__(self, model, optimizer, *stateful, ddp=None, word_timeout=3.0, timeout=60.0,
                 snapshot=True):
        self.module, self.stateful = model, stateful
        # One optimizer, or a list of them (a GAN's two, a model's parts).
        self.optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        self.optimizer = self.optimizers[0]
        # `snapshot`: the parameters and optimizer state copied before each update (one more
        # copy in memory); without, a peer lost after an update in a step is refused.
        self.snapshot = snapshot
        self.updates = 0      # optimizer updates this rank applied, as of `committed`
        self._txn = None      # the open step's undo record (_Txn)
        self._grads_left = False  # the last whole step left gradients and made no update
        self._refusal = None  # a program shape that cannot be recovered exactly, with its place
        self._hooks_checked = False
        self.ddp_kwargs = dict(ddp or {})
        self.word_timeout, self.timeout = word_timeout, timeout
        self.backend = dist.get_backend()
        self.device = _device(self.backend)
        self.rank = dist.get_rank()  # the same in every generation unless a node is lost
        self.committed = -1   # the last step this rank finished
        self.recoveries = 0
        self._current = None
        self._peer_layout = None
        self._old_groups = []
        fd = int(os.environ.get("DLRUN_CONTROL_FD", "-1"))
        self._words = _Words(fd) if fd >= 0 else None
        gen = _generation()
        self.replacement = self._words is not None and gen > 0
        if self._words is not None:
            self._words.taken = gen
            # The group the program made after importing dlrun_report (dlrun_recovery imports it).
            self._words.group_sockets = _group_sockets(dlrun_report._tcp_at_import)
            if not self._words.group_sockets and dist.get_world_size() > 1:
                print("dlrun_recovery: rank %d: no connection of the process group was found (was "
                      "dlrun_recovery imported after init_process_group?); after a peer's loss a "
                      "survivor may wait for Gloo's timeout, and dlrun then restarts the group"
                      % self.rank, file=sys.stderr, flush=True)
            dlrun_report._record("C recovery")
            if self.backend == "nccl":
                self._words.nccl_group = dist.distributed_c10d._get_default_group()
            for o in self.optimizers:
                o.register_step_pre_hook(self._before_update)
                o.register_step_post_hook(self._after_update)
        if self.replacement:  # started in place of a lost rank: the state comes from a peer
            t0 = time.monotonic()
            root = self._transfer(replacement=True)
            secs = time.monotonic() - t0
            dlrun_report._record("P %d %.6f" % (max(self.committed, 0), secs))
            print("dlrun_recovery: rank %d took the state of step %d from rank %d in %.3f s "
                  "(generation %d)" % (self.rank, self.committed, root, secs, gen),
                  file=sys.stderr, flush=True)
            self.ddp = _ddp_like_peers(self.module, self.ddp_kwargs, self._peer_layout)
        else:
            self.ddp = DistributedDataParallel(self.module, **self.ddp_kwargs)

    def steps(self, total, start=0):
        """Yields the step numbers from `start` (a replacement: from the step after the one it
        received) to total - 1; a step interrupted by a peer's loss comes again."""
        if self.committed < 0:
            self.committed = start - 1
        while self.committed + 1 < total:
            if self._words is not None and self._words.pending():
                self._recover(None)  # told between two steps: regroup before computing
            self._current = self.committed + 1
            yield self._current

    def _before_update(self, optimizer, args, kwargs):
        """An optimizer's update begins. NCCL: the step's collectives run behind the CPU; wait
        for them, and give the step up when a peer was lost meanwhile (they were aborted: the
        gradients are not the sum). The word's thread marks the word before it aborts, so a sum
        the abort ended is never taken for a finished one. Then the parameters and the
        optimizer's state are copied, so that the step can still be given up after it."""
        if self.backend == "nccl":
            torch.cuda.current_stream().synchronize()
            if self._words.interrupted() or _nccl_failed(self._words.nccl_group):
                raise RuntimeError("a peer was lost during the step: its update is not applied")
        if self._txn is None:
            if self._refusal is None:
                self._refusal = ("optimizer.step() ran outside `with rec.step()` (after step %d):"
                                 " an update outside a step cannot be given up with it"
                                 % self.committed)
                print("dlrun_recovery: rank %d: %s; a peer's loss will restart the group from "
                      "the checkpoint" % (self.rank, self._refusal), file=sys.stderr, flush=True)
            return
        self._txn.before_update(optimizer, self.snapshot)

    def _after_update(self, optimizer, args, kwargs):
        self.updates += 1
        if self._txn is not None:
            self._txn.updates += 1

    def step(self):
        """The context of one step: a peer lost inside it ends in a recovery, and steps()
        yields the same step again; any other error goes on up."""
        return _Step(self)

    def _recover(self, error, txn=None):
        t0 = time.monotonic()
        word = self._words.wait(self.word_timeout) if self._words is not None else None
        if word is None:
            return False  # not a peer's loss: the error stands
        gen, port, place = word
        t_word = time.monotonic()
        what = str(error).splitlines()[0] if error is not None else "told between steps"
        if place is not None and place[1] > int(os.environ.get("WORLD_SIZE", "0")):
            print("dlrun_recovery: rank %d: a node joined: the group grows to %d ranks (%s); "
                  "joining generation %d" % (self.rank, place[1], what[:200], gen),
                  file=sys.stderr, flush=True)
        else:
            print("dlrun_recovery: rank %d: a peer was lost (%s); joining generation %d"
                  % (self.rank, what[:200], gen), file=sys.stderr, flush=True)
        try:
            if txn is not None:
                txn.undo()  # the step given up: as if it had not begun
            if self._refusal is not None:
                raise RuntimeError("refused: " + self._refusal)
            c10d = dist.distributed_c10d
            old = c10d._get_default_group()
            # Kept, never destroyed: destroying rank 0's old TCPStore server waits for its
            # thread, and the new group would wait with it.
            self._old_groups.append((old, c10d._world.pg_map.get(old)))
            c10d._abort_process_group()
            t_abort = time.monotonic()
            os.environ["MASTER_PORT"] = str(port)
            if place is not None:  # a node was lost: this rank's new place
                self.rank = place[0]
                os.environ.update(RANK=str(place[0]), WORLD_SIZE=str(place[1]),
                                  MASTER_ADDR=place[2])
            self._words.taken = gen
            if self.rank != 0:
                _await_store(os.environ.get("MASTER_ADDR", "127.0.0.1"), port, self.timeout)
            before = dlrun_report._tcp_sockets()
            dist.init_process_group(self.backend, timeout=datetime.timedelta(seconds=self.timeout))
            with self._words.cond:
                self._words.group_sockets = _group_sockets(before)
                if self.backend == "nccl":
                    self._words.nccl_group = c10d._get_default_group()
            for p in self.module.parameters():
                p.grad = None  # the interrupted step's half-reduced gradients
            t_group = time.monotonic()
            root = self._transfer()
            # A new DDP on the new group, with the sender's buckets on every rank (the
            # replacement's among them): a survivor's own may differ, when the fault came
            # during the buckets' rebuild after the first step. The old one's hooks on the
            # parameters go with its reducer.
            hooks, self.ddp = comm_hooks(self.ddp), None
            gc.collect()
            self.ddp = _ddp_like_peers(self.module, self.ddp_kwargs, self._peer_layout)
            carry_comm_hooks(hooks, self.ddp)
            self._hooks_checked = False  # against the replacement's, at the next step
        except Exception as e:
            raise RuntimeError("in-process recovery failed (generation %d): %s"
                               % (gen, str(e).splitlines()[0] if str(e) else type(e).__name__))
        secs = time.monotonic() - t0
        self.recoveries += 1
        dlrun_report._record("P %d %.6f" % (max(self.committed, 0), secs))
        if self.rank == root:
            print("dlrun_recovery: rank %d sent the state of step %d in %.3f s after the loss "
                  "(generation %d; the word %.3f s, old group aborted %.3f s, new group %.3f s, "
                  "transfer %.3f s)" % (root, self.committed, secs, gen, t_word - t0,
                                        t_abort - t_word, t_group - t_abort,
                                        time.monotonic() - t_group), file=sys.stderr, flush=True)
        return True

    def _transfer(self, replacement=False):
        """Collective: the lowest rank with the newest committed step sends its state to every
        rank behind it (a replacement is behind every survivor: a fault before the first step
        sends the state the survivors started with), and its DDP bucket layout to every rank;
        then every rank must hold the same parameters. Returns the sender."""
        rank, world, dev = dist.get_rank(), dist.get_world_size(), self.device
        # Each rank's last whole step, its optimizer updates by then, whether gradients were
        # left over from it without an update, and whether its program refuses.
        mine = torch.tensor([-2 if replacement else self.committed, self.updates,
                             int(self._grads_left), int(self._refusal is not None)],
                            dtype=torch.int64, device=dev)
        rows = [torch.zeros(4, dtype=torch.int64, device=dev) for _ in range(world)]
        dist.all_gather(rows, mine)
        rows = [[int(v) for v in t.tolist()] for t in rows]
        held = [row[0] for row in rows]
        best = max(held)
        root = held.index(best)
        if best < -1:
            raise RuntimeError("no rank holds a state to send")
        refusing = [str(r) for r, row in enumerate(rows) if row[3]]
        if refusing:
            raise RuntimeError("refused: " + (self._refusal or "rank(s) %s cannot recover "
                                              "exactly (their lines say why)" % ",".join(refusing)))
        if rows[root][2]:
            raise RuntimeError("refused: step %d ended with gradients and no optimizer update "
                               "(accumulated across steps, or an update skipped): gradients are "
                               "not part of the state sent; one rec.step() per update makes it "
                               "whole" % best)
        buffers = [n for n, _ in self.module.named_buffers()]
        if buffers and best >= 0 and rows[0][0] == -2:
            raise RuntimeError("refused: rank 0 was lost, and with it the module's buffers as of "
                               "step %d (%r...: running statistics, which DDP takes from rank 0 "
                               "at each forward): no other rank holds them" % (best, buffers[0]))
        counts = [str(r) for r, row in enumerate(rows) if row[0] == best and row[1] != rows[root][1]]
        if counts:
            raise RuntimeError("refused: rank(s) %s applied another number of optimizer updates "
                               "by step %d than rank %d (%d): an update outside the step, or one "
                               "applied twice" % (",".join(counts), best, root, rows[root][1]))
        layout = [_bucket_layout(self.ddp) if rank == root else None]
        dist.broadcast_object_list(layout, src=root, device=dev)
        self._peer_layout = layout[0]
        if rank == root:
            buf = io.BytesIO()
            torch.save({"model": self.module.state_dict(),
                        "optimizers": [o.state_dict() for o in self.optimizers],
                        "stateful": [s.state_dict() for s in self.stateful]}, buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(dev)
            for r in (r for r in range(world) if held[r] < best):
                dist.send(torch.tensor([data.numel()], dtype=torch.int64, device=dev), r)
                dist.send(data, r)
        elif held[rank] < best:
            n = torch.zeros(1, dtype=torch.int64, device=dev)
            dist.recv(n, root)
            data = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
            dist.recv(data, root)
            state = torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=False,
                               map_location=dev if dev.type == "cuda" else None)
            self.module.load_state_dict(state["model"])
            for o, sd in zip(self.optimizers, state["optimizers"]):
                o.load_state_dict(sd)
            for s, sd in zip(self.stateful, state["stateful"]):
                s.load_state_dict(sd)
        synced = self.ddp_kwargs.get("forward_sync_buffers",
                                     self.ddp_kwargs.get("broadcast_buffers", True))
        if buffers and held[rank] < best and not synced:
            print("dlrun_recovery: rank %d: its buffers (%r...), its own with DDP's "
                  "broadcast_buffers off, were lost with its process: it goes on with rank %d's"
                  % (rank, buffers[0], root), file=sys.stderr, flush=True)
        check_replicas(self.module, self.stateful, root, self.device)
        self.committed = best
        self.updates = rows[root][1]
        self._grads_left = False
        return root


class _Step:
    def __init__(self, rec):
        self.rec = rec

    def __enter__(self):
        rec = self.rec
        if not rec._hooks_checked:  # collective: before any rank's first hooked backward
            rec._refusal = rec._refusal or check_comm_hooks(rec.ddp)
            rec._hooks_checked = True
        rec._txn = _Txn(rec) if rec._words is not None else None
        return rec._current

    def __exit__(self, kind, value, tb):
        rec = self.rec
        txn, rec._txn = rec._txn, None
        if kind is None:
            rec.committed = rec._current
            # Gradients left without an update carry into the next step: state no transfer sends.
            rec._grads_left = (txn is not None and txn.updates == 0 and
                               any(p.grad is not None for p in rec.module.parameters()))
            return False
        if not isinstance(value, Exception) or rec._words is None:
            return False
        return rec._recover(value, txn)


def _bucket_layout(ddp):
    """The order DDP rebuilds its gradient buckets in, after its first step (None before it
    has finished one, or no DDP). Every step after the first runs on the rebuilt buckets, also
    the second when a fault stopped the rebuild in its forward on some rank: the state sent is
    that of a step >= 0, and the step done again runs, on every rank, on these."""
    if ddp is None:
        return None
    order = ddp._get_ddp_logging_data().get("prev_iteration_grad_ready_order_indices", "")
    if not order:
        return None
    return [int(i) for i in order.split(",")]


def _ddp_like_peers(module, kwargs, order):
    """A DDP whose gradient buckets are those its peers rebuilt theirs to (`order`: the order
    their gradients became ready in), as DDP's reducer rebuilds them after its first step, so
    every rank sums the same elements in the same order as before the fault."""
    if order is None:  # they have not rebuilt theirs yet (the fault came in the first step)
        return DistributedDataParallel(module, **dict(kwargs, init_sync=False))
    compute = dist._compute_bucket_assignment_by_size

    def rebuilt(params, limits, expect_sparse, *rest):
        # The reducer's rebuild: a first bucket of 1 MiB, then bucket_cap_mb each.
        cap = int(kwargs.get("bucket_cap_mb", 25) * 1024 * 1024)
        first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024)
        ordered = [params[i] for i in order]
        sparse = [expect_sparse[i] for i in order] if expect_sparse else []
        buckets, caps = compute(ordered, [first, cap], sparse, order)
        # The DDP constructor reverses the bucket list it gets; the reducer's rebuild does not.
        return list(reversed(buckets)), list(reversed(caps))

    dist._compute_bucket_assignment_by_size = rebuilt
    try:
        # No collective: the peers keep their DDP; the state came from them, digests checked.
        ddp = DistributedDataParallel(module, **dict(kwargs, init_sync=False))
    finally:
        dist._compute_bucket_assignment_by_size = compute
    return ddp  # it rebuilds after its first step, as its peers' do after a new group


def _generation():
    """The group generation dlrun started this process in (DLRUN_RECOVERY_GEN; 0: the first)."""
    return int(os.environ.get("DLRUN_RECOVERY_GEN", "0") or 0)


def is_replacement():
    """True in a process dlrun started in place of a lost rank (it will take the state from a
    peer when Recoverable is made: loading a checkpoint before that is time lost)."""
    return "DLRUN_CONTROL_FD" in os.environ and _generation() > 0
