"""The process group's side of dlrun_recovery (docs/RECOVERY.md, "Python programs"): the
agent's words on DLRUN_CONTROL_FD, the old group's end at the word, the errors that mean a lost
peer, and DDP's bucket layout carried to a rebuilt wrapper. Internal to dlrun_recovery (beside
it on the workers' PYTHONPATH and in the wheel)."""
import os
import socket
import sys
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dlrun_report


class Loss:
    """A peer's loss as this rank met it: the step given up (None: told between steps), the
    agent's word (generation, port, place), and when it was met, heard and the old group ended
    (the sender's timing line counts from `seen`)."""

    def __init__(self, step, seen):
        self.step, self.seen = step, seen
        self.word = self.heard = self.ended = None


class Words:
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
                end_group(sockets)
                if nccl is not None:
                    abort_nccl(nccl)
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


def end_group(sockets):
    """Every collective of the current group ends in an error at once, also one waiting on a
    live peer that waits on the lost one (it would wait for Gloo's timeout; ProcessGroupGloo's
    abort() does not end a wait of DDP's reducer): its connections are shut down under it. The
    main thread aborts and forgets the group once its step has failed. Listening sockets are left
    alone (Gloo's listener aborts the process on a failed accept)."""
    for inode, fd in sockets.items():
        try:
            mine = os.dup(fd)  # this process' own reference: the check below holds until close
        except OSError:
            continue  # closed meanwhile
        if dlrun_report._socket_inode(mine) != inode:
            os.close(mine)  # closed meanwhile, its fd reused
            continue
        try:
            s = socket.socket(fileno=mine)
        except OSError:
            os.close(mine)
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def abort_nccl(group):
    """ncclCommAbort on the group's communicators: a kernel waiting on the lost peer ends, and
    the main thread's wait on it with it."""
    try:
        group.abort()
    except Exception as e:  # an abort that fails leaves the recovery's own bound to end it
        print("dlrun_recovery: aborting the NCCL group: %s" % e, file=sys.stderr, flush=True)


def nccl_failed(group):
    """True when PyTorch's watchdog saw the NCCL group fail (a lost peer, a timeout): its last
    sums may have been ended under it, whoever aborted them."""
    try:
        err = group._get_backend(torch.device("cuda")).get_error()
        return err != type(err).SUCCESS
    except Exception:  # a PyTorch without ProcessGroupNCCL.get_error: the word alone tells
        return False


class Refused(RuntimeError):
    """What in-process recovery cannot make exact: the group restarts from the checkpoint
    (docs/RECOVERY.md, "What is refused"). Raised on the survivors; never recovered in process."""


# Words of the errors a collective raises when a peer is gone (Gloo's, NCCL's, c10d's): such an
# error waits for the agent's word; any other error in a step is the program's own and goes on
# up at once.
_COMM_WORDS = ("connection closed", "connection reset", "broken pipe", "gloo", "nccl",
               "timed out", "timeout", "socket", "processgroup", "process group", "peer",
               "aborted", "connection refused", "distbackenderror", "distnetworkerror")


def is_comm_error(e):
    if isinstance(e, Refused):
        return False
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = ("%s %s" % (type(e).__name__, e)).lower()
    return any(w in text for w in _COMM_WORDS)


def device_of(backend):
    """Where the recovery's own collectives put their tensors: the GPU for NCCL."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_sockets(before):
    """The TCP connections made since `before` (a dlrun_report._tcp_sockets())."""
    return {i: fd for i, fd in dlrun_report._tcp_sockets().items() if i not in before}


def equal_across_ranks(values, dev):
    """Collective: for each int64 of `values`, whether every rank has the same."""
    mine = torch.tensor(values, dtype=torch.int64, device=dev)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    rows = [t.tolist() for t in every]
    return [all(row[i] == rows[0][i] for row in rows) for i in range(len(values))]


def bucket_layout(ddp):
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


def ddp_like_peers(module, kwargs, order):
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



def generation():
    """The group generation dlrun started this process in (DLRUN_RECOVERY_GEN; 0: the first)."""
    return int(os.environ.get("DLRUN_RECOVERY_GEN", "0") or 0)
