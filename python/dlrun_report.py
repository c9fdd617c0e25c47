"""Step reports for dlrun's telemetry (docs/TELEMETRY.md), for Python training scripts.

    import dlrun_report
    for step in range(steps):
        t0 = time.monotonic()
        ...
        dlrun_report.report_step(step, samples=len(batch), step_s=time.monotonic() - t0,
                                 data_s=load_time, loss=loss.item())

Or let the helper time the data loader: the wait for each batch becomes the step's data_s
(the data wait the end-of-job report weighs against GPU use):

    for batch in dlrun_report.timed(loader):       # report_step gets data_s by itself
        ...
        dlrun_report.report_step(step, samples=len(batch), step_s=...)

    for batch in dlrun_report.timed(loader, report=True):   # or every step reported for you
        ...                                                 # (step_s: batch to batch)

After loading a checkpoint, `dlrun_report.report_resume(step, load_s)` tells dlrun where this
attempt resumed, for the time-lost-to-restarts ledger. `dlrun_report.done()`, last, says the
work is done: a crash in the interpreter's teardown after it does not fail the job.

One text line per step on the pipe dlrun passes in DLRUN_HEARTBEAT_FD; outside dlrun (the
variable unset) every call does nothing. Standard library only; never raises and never blocks.

Preemption (`dlrun slurm --preemptible`: Slurm sends SIGUSR1 before the time limit, dlrun passes
it to every worker):

    preemption = dlrun_report.Preemption()      # before the loop: catches SIGUSR1
    for step in range(start, steps):
        ...
        if preemption.requested():              # every rank gets the same answer
            save_checkpoint(step)               # rank 0 writes it
            preemption.checkpointed(step)       # rank 0: `scontrol requeue` the Slurm job
            break

The requeued job runs again from the start of its script and the program resumes from its
checkpoint. Without the hook SIGUSR1 ends a Python worker and dlrun restarts the group.

Flight Recorder (docs/STACKS.md): NCCL dumps every rank's collective history by itself when a
collective times out, into the run's log directory (dlrun sets TORCH_FR_DUMP_TEMP_FILE). Gloo
records the same history but never dumps it; after

    dlrun_report.dump_collectives_on_failure()  # after init_process_group

this rank dumps it when an exception ends the program (a Gloo timeout) or dlrun stops it, and
dlrun's failure report says which collective the ranks disagree on.

In-process recovery (docs/RECOVERY.md): dlrun_recovery.Recoverable, in dlrun_recovery.py beside
this file (it imports torch; this file does not).

Profiling (docs/PROFILING.md): in the ranks dlrun's `--profile torch --profile-ranks R` names,
report_step runs the PyTorch profiler over `--profile-steps A:B` (or from the import to the
exit) and writes a Chrome trace where dlrun lists it; under `--profile nsys` with a step range
it brackets the steps with cudaProfilerStart/Stop. Other ranks are untouched.
"""
import atexit
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import time

_fd = None


def _pipe():
    global _fd
    if _fd is None:
        try:
            _fd = int(os.environ.get("DLRUN_HEARTBEAT_FD", "-1"))
            os.set_blocking(_fd, False)
        except (ValueError, OSError):
            _fd = -1
    return _fd


_profile = None


def _profile_step(step):
    global _profile
    if _profile is None:
        from dlrun_profile import Profile  # beside this file
        _profile = Profile()
    _profile.step(int(step))


_data_wait = None  # seconds waited in timed() since the last report_step (None: not timing)


def _batch_size(batch):
    """The samples in a batch: the leading dimension of its first tensor (an array with at least
    one dimension), looked for through lists, tuples and dicts (a DataLoader's usual
    collations: `(x, y)`, `(step, x, y)`, `{"image": ..., "label": ...}`); else the length of
    a list of plain samples; 1 when unknown."""
    stack = [batch]
    seen = 0
    while stack and seen < 64:
        item = stack.pop(0)
        seen += 1
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    if isinstance(batch, list) and batch and not any(
            isinstance(b, (list, tuple, dict)) or hasattr(b, "shape") for b in batch):
        return len(batch)  # a list of plain samples (file names, strings)
    return 1


class timed:
    """Iterates `loader` (a DataLoader, or any iterable of batches) and times the wait for each
    batch: the next report_step without a data_s gets the wait since the last one. With
    `report=True` each step is reported for you when the next batch is asked for (and the last
    at the end): step_s from one request to the next, the batch's samples, step numbers from
    `start_step`; `loss` may be set on the iterator (`it.loss = loss.item()`) to go with it.
    The samples of a batch are the leading dimension of its first tensor; `samples=N` says it
    instead (a batch whose first tensor is not batched). Costs two clock reads per batch."""

    def __init__(self, loader, report=False, start_step=1, samples=None):
        self._loader = loader
        self._report = report
        self._samples = None if samples is None else int(samples)
        self._step = int(start_step)
        self.loss = None

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        global _data_wait
        clock = time.monotonic
        it = iter(self._loader)
        last = None  # (request time, wait, samples) of the batch in use
        while True:
            t0 = clock()
            if last is not None and self._report:
                self._emit(last, t0)
            try:
                batch = next(it)
            except StopIteration:
                return
            wait = clock() - t0
            _data_wait = (_data_wait or 0.0) + wait
            size = self._samples if self._samples is not None else _batch_size(batch)
            last = (t0, wait, size if self._report else 0)
            yield batch

    def _emit(self, last, now):
        global _data_wait
        t0, wait, samples = last
        _data_wait = None
        report_step(self._step, samples, now - t0, data_s=wait, loss=self.loss)
        self._step += 1
        self.loss = None


def report_step(step, samples, step_s, data_s=None, compute_s=None, sync_s=None, loss=None):
    """Reports one step: its number, the samples this rank processed, its wall time in s, and
    optionally the time waiting for data, computing, and in the gradient sync, and the loss.
    Inside a `timed` loader loop data_s defaults to the wait for batches since the last call."""
    global _data_wait
    if data_s is None and _data_wait is not None:
        data_s = _data_wait
    _data_wait = None if _data_wait is None else 0.0
    if _profile is not None:
        _profile_step(step)
    fd = _pipe()
    if fd < 0:
        return
    line = "S %d %d %.6f" % (int(step), int(samples), max(0.0, float(step_s)))
    for key, value in (("data_s", data_s), ("compute_s", compute_s), ("sync_s", sync_s)):
        if value is not None and value >= 0:
            line += " %s=%.6g" % (key, float(value))
    if loss is not None and math.isfinite(float(loss)):
        line += " loss=%.6g" % float(loss)
    try:
        os.write(fd, (line + "\n").encode())  # one write: atomic on a pipe
    except OSError:
        pass  # a full pipe: the agent has enough to read


def _record(line):
    """One record line on dlrun's pipe (dlrun_recovery's declaration and state records)."""
    fd = _pipe()
    if fd < 0:
        return
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:
        pass


def _tcp_sockets():
    """{inode: fd} of this process's TCP sockets that are not listening, asked of each socket
    fd itself (Linux /proc/self/fd, fstat, getsockopt): never /proc/self/net/tcp, whose read
    walks the kernel's whole connection table (8 ms on a quiet machine, 20-30 ms on a busy
    one, once on each side of a recovery's new group)."""
    sockets = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    for name in fds:
        inode = _socket_inode(int(name), tcp=True)
        if inode is not None:
            sockets[inode] = int(name)
    return sockets


def _socket_inode(fd, tcp=False):
    """The inode (str) of the socket open at `fd`; None when none is (with tcp, also when it is
    not a connected or connecting TCP socket: a listener, a Unix socket)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    if tcp:
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            return None
        try:
            if (s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM
                    or s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                return None
        except OSError:
            return None
        finally:
            s.detach()
    return str(st.st_ino)


def _from_environment():
    """What this module takes from the environment at its import; called again in a worker that
    dlrun's fork server forked (it imported this module before the worker's environment)."""
    global _tcp_at_import
    # The sockets open before the program made its process group (dlrun_recovery shuts down the
    # group's own on a peer's loss, never these); only where dlrun passed the control pipe.
    _tcp_at_import = _tcp_sockets() if "DLRUN_CONTROL_FD" in os.environ else {}
    if os.environ.get("DLRUN_PROFILE") in ("torch", "nsys"):
        _profile_step(-2)  # from the start, when the range says so


_from_environment()


def report_resume(step, load_s):
    """Says this attempt resumed from the checkpoint of `step` (the last step it holds), and
    that loading it took `load_s` seconds. Call it once, after loading a checkpoint: dlrun's
    restart ledger then counts the load and the steps computed again (docs/TELEMETRY.md)."""
    fd = _pipe()
    if fd < 0 or int(step) < 0:
        return
    load_s = float(load_s)
    if not math.isfinite(load_s) or load_s < 0:
        load_s = 0.0
    try:
        os.write(fd, ("R %d %.6f\n" % (int(step), load_s)).encode())
    except OSError:
        pass


class pause:
    """Declares work that is not a training step, so dlrun's hang detection does not count it
    (an evaluation loop, a checkpoint save, a long data preparation):

        with dlrun_report.pause("eval"):
            evaluate(model)

    While it lasts, the rank's missing step records are no hang; the next step is judged
    from the end of the pause. `what` is one word, shown when a rank hangs inside it."""

    def __init__(self, what="pause"):
        word = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(what))[:64]
        self.what = word or "pause"

    def __enter__(self):
        _record("Z pause " + self.what)
        return self

    def __exit__(self, *exc):
        _record("Z resume")
        return False


def done():
    """Says this rank's work is done: call it last, after the final checkpoint is written and
    `dist.destroy_process_group()`. If the process then dies of a signal as the interpreter
    tears down (PyTorch 2.x's "terminate called without an active exception" at exit, now and
    then), dlrun counts the rank as finished, with a warning, instead of failing or restarting a
    job whose work is complete (docs/USAGE.md, "Done"). An exit code other than 0 still counts."""
    _record("D done")


def heartbeat():
    """Tells dlrun this worker is alive (for --hang-timeout), without a step record."""
    fd = _pipe()
    if fd >= 0:
        try:
            os.write(fd, b"h")
        except OSError:
            pass


def dump_collectives_on_failure():
    """Dumps this rank's Flight Recorder (torch >= 2.8 records Gloo's collectives) to
    TORCH_FR_DUMP_TEMP_FILE<rank> when an uncaught exception ends the program or SIGTERM stops
    it (then the signal goes on as before). Returns False where there is nothing to do: no dump
    file set (not under dlrun with a log dir), or a torch without the recorder."""
    if not (os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or
            os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")):
        return False
    try:
        import torch.distributed as dist
        from torch._C import _distributed_c10d as c10d
        dump_file = c10d._dump_fr_trace_file
    except (ImportError, AttributeError):
        return False
    done = []

    def dump():
        if done or not dist.is_initialized():
            return
        done.append(True)
        try:
            dump_file(dist.get_rank())
        except Exception as e:  # the failure being reported matters more
            print("dlrun_report: cannot dump the flight recorder: %s" % e, file=sys.stderr)

    previous_hook = sys.excepthook

    def on_exception(kind, value, tb):
        dump()
        previous_hook(kind, value, tb)

    sys.excepthook = on_exception
    previous_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        dump()
        if callable(previous_term):
            previous_term(signum, frame)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    return True


class Preemption:
    """Catches SIGUSR1 (the preemption warning dlrun passes on) and says when to checkpoint.

    requested(): whether any rank got the signal. With torch.distributed initialized and more
    than one rank it is one small all-reduce, so call it at the same point of every rank's step;
    pass sync=False for this rank's own flag only.
    checkpointed(step): call on every rank once the checkpoint of `step` is on disk. On rank 0 of
    a job whose script asked for it (DLRUN_REQUEUE_ON_SIGNAL=1 and SLURM_JOB_ID, as
    `dlrun slurm --preemptible` writes), it runs `scontrol requeue $SLURM_JOB_ID` and returns
    True; Slurm then ends this run and starts the job again.
    """

    def __init__(self, signum=signal.SIGUSR1):
        self._flag = False
        self._signum = signum
        signal.signal(signum, self._on_signal)
        # Once the program exits, a late warning is ignored: Slurm signals each node's step at
        # its own moment, so a rank that already stopped at the agreed step can get it while its
        # interpreter shuts down, which restores the default action (death) for a handled signal.
        atexit.register(signal.signal, signum, signal.SIG_IGN)

    def _on_signal(self, signum, frame):
        self._flag = True

    def requested(self, sync=True):
        if not sync:
            return self._flag
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized() \
                or dist.get_world_size() < 2:
            return self._flag
        import torch
        device = "cpu"
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        flag = torch.tensor([1.0 if self._flag else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def checkpointed(self, step):
        self._flag = False
        if os.environ.get("RANK", "0") != "0" or os.environ.get("DLRUN_REQUEUE_ON_SIGNAL") != "1":
            return False
        job = os.environ.get("SLURM_JOB_ID", "")
        if not job:
            return False
        # Said before the requeue: Slurm stops this run as soon as it takes the job back, and a
        # line printed after `scontrol requeue` returns may never reach the job's output.
        print("requeueing Slurm job %s after the checkpoint at step %d" % (job, int(step)),
              flush=True)
        try:
            subprocess.run(["scontrol", "requeue", job], check=True, timeout=60,
                           stdout=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            print("dlrun_report: scontrol requeue %s failed: %s" % (job, e), file=sys.stderr,
                  flush=True)
            return False
        return True
