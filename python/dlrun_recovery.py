"""In-process recovery for torch.distributed programs run by dlrun (docs/RECOVERY.md, "A fault
costs one step"): when a rank dies, the others keep their processes, dlrun starts the lost rank
again, and it takes the state from a survivor; at most the interrupted step is done again, and
no checkpoint is read.

    import dlrun_recovery
    dist.init_process_group("gloo")
    rec = dlrun_recovery.Recoverable(model, optimizer, scheduler)   # builds rec.ddp
    for step in rec.steps(total, start=first_step):   # a replacement starts where its peers are
        with rec.step() as s:                         # a peer lost inside: the step again
            loss = loss_fn(rec.ddp(inputs(step)), targets(step))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        if s.committed and step % 100 == 99:          # not after a step given up
            save_checkpoint(step)
    dist.destroy_process_group()
    dlrun_report.done()    # last: a crash in the interpreter's teardown is then no failure

`model` is the plain module: Recoverable wraps it in DistributedDataParallel (keyword arguments
in `ddp=`) and wraps it again after a recovery, so use `rec.ddp` each step, not a copy of it.
`optimizer` may be a list. A step is whole or not at all (dlrun_step.py; docs/RECOVERY.md): a
step given up is undone on the survivors, after the update too; what cannot be made exact is
refused in one line, and the group restarts from the checkpoint.
The objects after the optimizer (an LR scheduler, an EMA, anything with state_dict() and
load_state_dict()) travel with the model and optimizer to the replacement. A step's data comes
from `rec.loader(loader)` (a given-up step gets its batch again; a replacement starts at the
lost rank's) or follows from the step number (and the rank); a loop over epochs uses
`rec.epochs()` and `rec.resume(step)` (docs/RECOVERY.md, "Python programs: the checklist").

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
unless the user set it (dlrun's default, torchrun's 1, lets PyTorch's watchdog end the process).
"""
import datetime
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dlrun_report
from dlrun_group import (Loss as _Loss, Refused, Words as _Words,
                         ddp_like_peers as _ddp_like_peers, device_of as _device,
                         equal_across_ranks as _equal_across_ranks,
                         generation as _generation, group_sockets as _group_sockets,
                         is_comm_error as _is_comm_error, nccl_failed as _nccl_failed)
from dlrun_loader import Loader as _Loader, watch_raw_loaders
from dlrun_step import (Step as _Step, await_store as _await_store, carry_comm_hooks,
                        comm_hooks, flat_inputs,
                        RNG_NAMES, rng_digests, rng_state, same_inputs)
import dlrun_transfer
from dlrun_step import digest as _digest  # noqa: F401 (the test programs' digest)
from dlrun_step import exit_now as _exit_now
_active = [None]  # the Recoverable of this process (one per process)
# Here, not in its modules (dlrun's fork server imports those before the worker's environment).
if "DLRUN_CONTROL_FD" in os.environ:  # dlrun's own "1" replaced; the user's value kept
    if os.environ.get("DLRUN_NCCL_ERROR_HANDLING_DEFAULT") == "1":
        os.environ.update(TORCH_NCCL_ASYNC_ERROR_HANDLING="0", NCCL_ASYNC_ERROR_HANDLING="0")
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")


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
        self._txn = None      # the open step's undo record (dlrun_step.StepUndo)
        self._grads_left = False  # the last whole step left gradients and made no update
        self._refusal = None  # a program shape that cannot be recovered exactly, with its place
        self._hooks_checked = False
        self.ddp_kwargs = dict(ddp or {})
        for s in stateful:
            if not (callable(getattr(s, "state_dict", None)) and
                    callable(getattr(s, "load_state_dict", None))):
                raise TypeError("dlrun_recovery.Recoverable: %s given as state has no "
                                "state_dict()/load_state_dict() (a DistributedSampler has none: "
                                "its position is rec.loader()'s)" % type(s).__name__)
        self.word_timeout, self.timeout = word_timeout, timeout
        self.broadcast = bool(self.ddp_kwargs.get(
            "forward_sync_buffers", self.ddp_kwargs.get("broadcast_buffers", True)))
        self._last_raw = None     # a DataLoader iterator of the program's own, drawn last
        self._raw_loader = False  # a DataLoader iterator of the program's own was drawn from
        # Per generator (dlrun_step.RNG_NAMES): a step of this rank drew from it; every rank's
        # was equal when the group was first made.
        self._rng_used = [False] * len(RNG_NAMES)
        self._rng_shared = [True] * len(RNG_NAMES)
        self._loaders = []        # rec.loader() wrappers, in the order made
        self._positions = []      # a replacement's: where the lost rank's loaders were
        self._loss = None         # a peer's loss met in a step (_Loss), until the regroup
        self._redo_inputs = None  # (step, inputs at the given-up attempt's first forward)
        self._rank0_buffers = None  # (step, rank 0's buffers as of it): from DDP's broadcast
        self.backend = dist.get_backend()
        self.device = _device(self.backend)
        self._rng_commit = rng_state(self.device)  # the generators as of the last whole step
        self._rng_commit_digests = rng_digests(self._rng_commit)
        self._in_ddp = False    # inside DDP's forward (after its broadcast of rank 0's buffers)
        self._sending = False   # this rank's state is being sent (its state_dict() is asked)
        self.rank = dist.get_rank()  # the same in every generation unless a node is lost
        self.committed = -1   # the last step this rank finished
        self.recoveries = 0
        self._current = None
        self._epoch = None
        self._peer_layout = None
        self._old_groups = []
        fd = int(os.environ.get("DLRUN_CONTROL_FD", "-1"))
        self._words = _Words(fd) if fd >= 0 else None
        gen = _generation()
        self.replacement = self._words is not None and gen > 0
        if self.ddp_kwargs.get("find_unused_parameters"):
            self._refusal = ("DDP's find_unused_parameters=True: a rebuilt DDP cannot keep the "
                             "peers' bucket layout and unused-parameter marks")
            if self._words is not None:
                print("dlrun_recovery: rank %d: in-process recovery is off for this program (%s):"
                      " a lost rank restarts the group from the checkpoint"
                      % (self.rank, self._refusal), file=sys.stderr, flush=True)
        if self._words is not None:
            self._watch_program(gen)
        if self.replacement:  # started in place of a lost rank: the state comes from a peer
            t0 = time.monotonic()
            root = self._transfer(replacement=True)
            secs = time.monotonic() - t0
            dlrun_report._record("P %d %.6f" % (max(self.committed, 0), secs))
            print("dlrun_recovery: rank %d took the state of step %d from rank %d in %.3f s "
                  "(generation %d)" % (self.rank, max(self.committed, 0), root, secs, gen),
                  file=sys.stderr, flush=True)
            self.ddp = self._watched(_ddp_like_peers(self.module, self.ddp_kwargs,
                                                     self._peer_layout))
        else:
            self.ddp = self._watched(DistributedDataParallel(self.module, **self.ddp_kwargs))
            if self._words is not None:  # every first process makes this: one allgather
                self._rng_shared = _equal_across_ranks(self._rng_commit_digests, self.device)

    def _watch_program(self, gen):
        """Under dlrun: the hooks on the program's module, optimizers and loaders, the
        declaration to the agent, and the current group's connections."""
        _active[0] = self
        watch_raw_loaders(_active)
        self.module.register_forward_pre_hook(self._forward_pre, with_kwargs=True)
        self.module.register_state_dict_pre_hook(self._state_dict_pre)
        for o in self.optimizers:
            o.register_state_dict_pre_hook(lambda o: self._state_dict_pre(o, "", False))
        self._excepthook = sys.excepthook
        sys.excepthook = self._uncaught
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

    def _watched(self, ddp):
        """`ddp` with hooks that tell the module's forward pre-hook it runs inside DDP's forward
        (after DDP's broadcast of rank 0's buffers)."""
        if self._words is not None:
            ddp.register_forward_pre_hook(lambda m, a: setattr(self, "_in_ddp", True))
            ddp.register_forward_hook(lambda m, a, o: setattr(self, "_in_ddp", False))
        return ddp

    def _forward_pre(self, module, args, kwargs):
        """The module's first forward in a step through DDP: its inputs kept (by reference) to
        compare with the step's next attempt, and the buffers DDP just broadcast from rank 0."""
        txn = self._txn
        if txn is None or txn.inputs is not None or not self._in_ddp:
            return
        txn.inputs = flat_inputs(args, kwargs)
        if self.broadcast:
            txn.rank0_buffers = [b.detach().clone() for b in module.buffers()]
        redo, self._redo_inputs = self._redo_inputs, None
        if redo is not None and redo[0] == self._current and not same_inputs(redo[1], txn.inputs):
            raise _said(self.rank, "step %d was done again on other inputs than its first "
                        "attempt: its batch came from an iterator the given-up attempt had "
                        "advanced (a DataLoader iterator of the program's own?); give the loader "
                        "to rec.loader(loader)" % self._current)

    def _state_dict_pre(self, obj, prefix, keep_vars):
        """A checkpoint of a given-up step's state would be labelled with that step and hold
        the one before: refused."""
        if self._loss is not None and not self._sending:
            raise _said(self.rank, "the state was asked for (a checkpoint?) after step %d was "
                        "given up (a peer was lost in it); it holds step %d: test `s.committed` "
                        "of `with rec.step() as s:` before saving" % (self._loss.step,
                                                                      self.committed))

    def _uncaught(self, kind, value, tb):
        """The program ends on an exception: outside a step after a peer's loss, one line; then
        the process ends at once (exit_now), not after Python's teardown."""
        # A collective's error comes before the agent's word, which tells a peer was lost.
        if (self._txn is None and self._words is not None and not isinstance(value, Refused)
                and (self._words.interrupted() or _is_comm_error(value)
                     and self._words.wait(self.word_timeout) is not None)):
            _say_refused(self.rank, "a collective between steps (after step %d, outside `with "
                         "rec.step()`) met the lost peer: only a step can be done again; put "
                         "it inside the step (%s: %s)" % (
                             self.committed, type(value).__name__,
                             str(value).splitlines()[0][:160] if str(value) else ""))
        self._excepthook(kind, value, tb)
        if issubclass(kind, Exception):  # a failure at once: the agent sees it in ~0.05 s
            _exit_now(1)

    def _refusal_now(self):
        if self._refusal is not None:
            return self._refusal
        if self._raw_loader:
            return ("the steps draw from a DataLoader iterator of the program's own: the "
                    "survivors' iterators are past the given-up step's batch, and a replacement's "
                    "starts its epoch at batch 0; give the loader to rec.loader(loader)")
        return None

    def steps(self, total, start=0):
        """Yields the step numbers from `start` (a replacement: from the step after the one it
        received) to total - 1; a step interrupted by a peer's loss comes again."""
        if self.committed < 0:
            self.committed = start - 1
        while self.committed + 1 < total:
            self._regroup_if_told()
            self._current = self.committed + 1
            yield self._current

    def resume(self, step):
        """The program resumed from its checkpoint of `step`: the next step is step + 1 (what
        steps(start=step + 1) says; for loops over epochs and rec.loader()). A replacement
        ignores it: its step comes from its peers."""
        if self.committed < 0 and not self.replacement:
            self.committed = step

    def epochs(self, total, start=0):
        """Yields the epoch numbers from `start` to total - 1; a replacement starts at its
        peers' epoch (with rec.loader(), at their batch in it)."""
        first = self._epoch if self.replacement and self._epoch is not None else start
        for epoch in range(first, total):
            self._epoch = epoch
            yield epoch

    def loader(self, loader):
        """`loader` (a DataLoader, or any iterable of batches) whose batches the recovery owns:
        a step given up hands its batches back, so that every survivor does it again on the
        same ones, and a replacement's first iter() starts at the lost rank's batch, its
        sampler and random generators as they were (docs/RECOVERY.md, "Python programs: the
        checklist")."""
        wrapped = _Loader(self, loader, self._positions.pop(0) if self._positions else None)
        self._loaders.append(wrapped)
        return wrapped

    def _regroup_if_told(self):
        """Between two steps: a step given up, or the word heard: the new group, the state."""
        if self._words is None:
            return
        if self._loss is not None or self._words.pending():
            self._recover(None)

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

    def _give_up(self, error, txn):
        """A step failed on a lost peer's error: wait for the agent's word, undo the step, end
        the old group. The new group is made when the next step begins, so that the code after
        the step's block runs knowing the step was not done (`s.committed` false): a collective
        there fails at once, a checkpoint of the state is refused."""
        loss = _Loss(self._current, time.monotonic())
        word = self._words.wait(self.word_timeout)
        if word is None:
            return False  # not a peer's loss: the error stands
        loss.word, loss.heard = word, time.monotonic()
        gen = word[0]
        what = str(error).splitlines()[0] if str(error) else type(error).__name__
        print("dlrun_recovery: rank %d: a peer was lost (%s); step %d given up, joining "
              "generation %d" % (self.rank, what[:200], self._current, gen),
              file=sys.stderr, flush=True)
        try:
            txn.undo()  # the step given up: as if it had not begun
        except RuntimeError as e:
            _say_refused(self.rank, str(e))
            raise Refused(str(e))
        if txn.inputs is not None:
            self._redo_inputs = (self._current, txn.inputs)
        if txn.rank0_buffers is not None:
            self._rank0_buffers = (self.committed, txn.rank0_buffers)
        self._end_old_group()
        loss.ended = time.monotonic()
        self._loss = loss
        return True

    def _end_old_group(self):
        c10d = dist.distributed_c10d
        old = c10d._get_default_group()
        # Kept, never destroyed: destroying rank 0's old TCPStore server waits for its
        # thread, and the new group would wait with it.
        self._old_groups.append((old, c10d._world.pg_map.get(old)))
        c10d._abort_process_group()

    def _recover(self, error):
        loss = self._loss
        if loss is None:  # told between two steps
            loss = _Loss(None, time.monotonic())
            word = self._words.wait(self.word_timeout)
            if word is None:
                return False
            loss.word, loss.heard = word, time.monotonic()
            gen, port, place = word
            if place is not None and place[1] > int(os.environ.get("WORLD_SIZE", "0")):
                print("dlrun_recovery: rank %d: a node joined: the group grows to %d ranks; "
                      "joining generation %d" % (self.rank, place[1], gen),
                      file=sys.stderr, flush=True)
            else:
                print("dlrun_recovery: rank %d: a peer was lost (told between steps); joining "
                      "generation %d" % (self.rank, gen), file=sys.stderr, flush=True)
            self._end_old_group()
            loss.ended = time.monotonic()
        gen, port, place = loss.word
        t_next = time.monotonic()  # the next step began (a step given up), or now
        self._loss = None
        try:
            refusal = self._refusal_now()
            if refusal is not None:
                raise Refused("refused: " + refusal)
            os.environ["MASTER_PORT"] = str(port)
            if place is not None:  # a node was lost: this rank's new place
                self.rank = place[0]
                os.environ.update(RANK=str(place[0]), WORLD_SIZE=str(place[1]),
                                  MASTER_ADDR=place[2])
            self._words.taken = gen
            if self.rank != 0:
                _await_store(os.environ.get("MASTER_ADDR", "127.0.0.1"), port, self.timeout)
            before = dlrun_report._tcp_sockets()
            c10d = dist.distributed_c10d
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
            self.ddp = self._watched(_ddp_like_peers(self.module, self.ddp_kwargs,
                                                     self._peer_layout))
            carry_comm_hooks(hooks, self.ddp)
            self._hooks_checked = False  # against the replacement's, at the next step
        except Exception as e:
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            if text.startswith("refused: "):
                _say_refused(self.rank, text[len("refused: "):])
            raise Refused("in-process recovery failed (generation %d): %s" % (gen, text))
        secs = time.monotonic() - loss.seen
        self.recoveries += 1
        # The ledger's "state from peer": the regroup itself (the wait before it is detection).
        dlrun_report._record("P %d %.6f" % (max(self.committed, 0), time.monotonic() - t_next))
        if self.rank == root:
            print("dlrun_recovery: rank %d sent the state of step %d %.3f s after it met the loss "
                  "(generation %d; the word %.3f s, old group ended %.3f s, to the next step "
                  "%.3f s, new group %.3f s, transfer %.3f s)"
                  % (root, max(self.committed, 0), secs, gen, loss.heard - loss.seen,
                     loss.ended - loss.heard, t_next - loss.ended, t_group - t_next,
                     time.monotonic() - t_group), file=sys.stderr, flush=True)
        return True

    def _transfer(self, replacement=False):
        return dlrun_transfer.transfer(self, replacement)


def _said(rank, why):
    """A Refused exception whose rule was said in one line (and told to the agent)."""
    _say_refused(rank, why)
    return Refused("refused: " + why)


def _say_refused(rank, why):
    """A refused recovery: one line here, and the record that tells dlrun's agent the rule."""
    line = " ".join(why.split())
    print("dlrun_recovery: rank %d: in-process recovery refused: %s; the group restarts from "
          "the checkpoint" % (rank, line), file=sys.stderr, flush=True)
    # A record is at most 256 bytes (launcher/workers/step_record.h): the rule's start, in ASCII.
    short = line.encode("ascii", "replace").decode()
    dlrun_report._record("C refused " + (short if len(short) <= 230 else short[:227] + "..."))


def is_replacement():
    """True in a process dlrun started in place of a lost rank (it will take the state from a
    peer when Recoverable is made: loading a checkpoint before that is time lost)."""
    return "DLRUN_CONTROL_FD" in os.environ and _generation() > 0
