"""The step's data for dlrun_recovery (docs/RECOVERY.md, "Python programs: the checklist"):
rec.loader()'s wrapper, whose iterators hand a given-up step's batches back and start a
replacement where the lost rank's was, and the watch on DataLoader iterators of the program's
own. Internal to dlrun_recovery (beside it on the workers' PYTHONPATH and in the wheel)."""
import itertools

import torch

from dlrun_step import rng_state, set_rng_state


def watch_raw_loaders(active):
    """Notes a draw from a DataLoader iterator the program made itself (not rec.loader()'s)
    once steps have begun: its batches are not the recovery's to hand back or position."""
    base = torch.utils.data.dataloader._BaseDataLoaderIter
    if getattr(base.__next__, "_dlrun", False):
        return
    inner = base.__next__

    def __next__(self):
        rec = active[0]
        if rec is None or getattr(self, "_dlrun_owned", False):
            return inner(self)
        try:
            batch = inner(self)
        except StopIteration:  # a loop over it ended (a validation pass between steps)
            if rec._last_raw is self:
                rec._last_raw = None
            raise
        if rec._txn is not None:
            rec._raw_loader = True
        else:  # drawn between steps: it feeds the next step if no other draw ends it first
            rec._last_raw = self
        return batch

    __next__._dlrun = True
    base.__next__ = __next__


class Loader:
    """rec.loader(loader): the loader, whose iterators hand a given-up step's batches back and,
    in a replacement, start where the lost rank's was (its position sent by the survivor)."""

    def __init__(self, rec, loader, position):
        self._rec, self._loader, self._position = rec, loader, position
        self._iters = 0
        self._current = None

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):  # sampler, dataset, batch_size: the loader's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __iter__(self):
        pos, self._position = self._position, None
        if pos is not None:
            self._iters = pos[0]
        self._current = _LoaderIter(self, self._iters, pos)
        self._iters += 1
        return self._current

    def position(self):
        """(the iterator's number, its batches drawn by whole steps, the random generators
        before it was made, whether it was made after the last whole step) or None: where a
        replacement's loader starts."""
        it = self._current
        if it is None:
            return None
        return (it.index, it.committed, it.rng_before, it.made_at == self._rec.committed)

    def into_step(self, txn):
        if self._current is not None:
            self._current.into_step(txn)

    def skip_handed_back(self):
        if self._current is not None:
            self._current.committed += len(self._current.replay)
            self._current.replay = []


class _LoaderIter:
    def __init__(self, owner, index, pos):
        rec = owner._rec
        self.owner, self.index = owner, index
        self.committed = 0  # batches drawn by whole steps
        self.pending = []   # drawn outside a step: the next step's
        self.replay = []    # handed back by a given-up step: drawn again first
        self.made_at = rec.committed  # the last whole step when it was made
        now = rng_state(rec.device)
        if pos is None:
            self.rng_before = now
            self.it = iter(owner._loader)
        else:  # the generators as the lost rank's were at its iter(): the same shuffle, seeds
            self.rng_before = pos[2]
            set_rng_state(pos[2])
            self.it = _iter_from(owner._loader, pos[1])
            if not pos[3]:  # made before the last whole step: the generators as of that step
                set_rng_state(now)
            # else the lost rank made it after its last step, drawing from them as here
            self.committed = pos[1]
        try:
            self.it._dlrun_owned = True
        except AttributeError:
            pass

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.replay.pop(0) if self.replay else next(self.it)
        txn = self.owner._rec._txn
        if txn is not None:
            txn.drawn.append((self, batch))
        else:  # the last batch drawn between two steps is the next step's; earlier ones dropped
            self.committed += len(self.pending)
            self.pending = [batch]
        return batch

    def into_step(self, txn):
        txn.drawn.extend((self, b) for b in self.pending)
        self.pending = []

    def hand_back(self, batch):
        self.replay.insert(0, batch)


class _SkipBatches:
    """A batch sampler without its first `n` batches (their indices only are drawn)."""

    def __init__(self, inner, n):
        self.inner, self.n = inner, n

    def __iter__(self):
        return itertools.islice(iter(self.inner), self.n, None)

    def __len__(self):
        return max(0, len(self.inner) - self.n)


def _iter_from(loader, n):
    """An iterator of `loader` from its batch `n` on: a map-style DataLoader skips the first n
    batches' indices (no sample is loaded); anything else draws and drops them."""
    from torch.utils.data import DataLoader, IterableDataset
    sampler = getattr(loader, "batch_sampler", None)
    if (n and isinstance(loader, DataLoader) and sampler is not None
            and not isinstance(loader.dataset, IterableDataset)):
        object.__setattr__(loader, "batch_sampler", _SkipBatches(sampler, n))
        try:
            return iter(loader)
        finally:
            object.__setattr__(loader, "batch_sampler", sampler)
    it = iter(loader)
    for _ in range(n):
        next(it)
    return it
