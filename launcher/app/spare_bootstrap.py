# The warm spare's bootstrap (dlrun --warm-spares, launcher/app/worker_program.cc WarmSpareArgv), run as
# `python [FLAGS] -c <this> SCRIPT|-m MODULE ARGS...` with {SPARE_FD} and {FORK_SERVER_FD}
# replaced by the names of the variables that hold the fds it is given (common/contract.h).
# Compiled into dlrun (launcher/CMakeLists.txt), so nothing is read at run time.
#
# Two ways in. As a warm spare ({SPARE_FD} set): a thread at idle priority imports torch (the
# slow part of a Python worker's start) and torch._dynamo (PyTorch 2.x's DistributedDataParallel
# imports it, with sympy and ~900 modules, when the first one is built: ~1 s that a promoted
# spare would otherwise spend after the fault), so the spare takes no CPU from the workers it
# stands beside. The main thread waits for the worker's environment on contract::kSpareFd,
# replaces the environment, then waits for the imports (raised to normal priority, or replaced
# by a cold start when they are starved).
# As the node's fork server ({FORK_SERVER_FD} set; launcher/workers/fork_server.h): the same
# imports once, in the main thread, then one process per request of the agent on its socket
# (every worker, spare and replacement of the program on this node): copy-on-write, at any
# load. Each request: a kind (W a worker, S a spare), the CPUs, the fd numbers its fds take, the
# environment. A middle process forks each and goes, so the worker becomes the agent's child
# (the agent is a subreaper) and the agent reaps it as any. The server keeps ready processes
# forked ahead (one per local rank and one more), each under a middle that became a `sleep`:
# a request is handed to one, the middle killed, and the pid answered in about a millisecond.
# Either way the process then makes a rank other than 0 wait for rank 0's store port before its
# TCPStore client connects, and runs the script as `python SCRIPT` does (or the module, as
# `python -m`).
import os, sys, threading
def _dlrun_set_environ(entries):
    """The worker's whole environment, from its KEY=VALUE entries (bytes)."""
    os.environ.clear()
    for kv in entries:
        key, eq, value = kv.partition(b"=")
        if key and eq:
            os.environb[key] = value
def _dlrun_freeze():
    """What the imports made kept out of the collections until the exit: a collection would
    touch (and so copy, in a fork) every page of it, and scanning it costs time. At the exit it
    is let go, so that the last collection frees it as it would (else bindings that count their
    objects, triton's, report leaks)."""
    import atexit, gc
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
def _dlrun_serve(server_fd):
    """The fork server's loop; returns only in a forked process: its spare fd, or -1 (a worker,
    its environment already set)."""
    import ctypes, select, socket
    try:
        import torch, torch.distributed, torch.nn.parallel
        import torch._dynamo
    except Exception:
        pass  # a program that does not import torch: the fork is cheap all the same
    # dlrun's helpers (python/, on the workers' PYTHONPATH; compiled at each import where no
    # bytecode is written), imported as outside a job: what they take from the environment, a
    # forked worker takes again. Not dlrun_recovery: its import changes NCCL's settings.
    env = dict(os.environb)
    os.environ.clear()
    try:
        import dlrun_report, dlrun_loader, dlrun_transfer  # noqa: F401
    except Exception:
        pass
    os.environb.update(env)
    libc = ctypes.CDLL(None, use_errno=True)
    _dlrun_freeze()
    sock = socket.socket(fileno=server_fd)
    sock.set_inheritable(False)
    agent = os.getppid()
    # Ready processes, forked ahead, one per local rank and one more (a refused recovery's
    # replacement, then the whole group restarted): a request is then answered in about a
    # millisecond, not the ~90 ms of two forks of an interpreter that holds torch and the middle
    # one's exit. Refilled, all in a row, once no request came for half a second (a restart's
    # requests come together): 2 s was slower on a busy node (bench/RESULTS.md), a fault soon
    # after the start then found the pool empty.
    try:
        size = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) + 1
    except ValueError:
        size = 2
    # Filled before the agent hears "ready"; a fork that fails is not tried again at once.
    pool, said_ready, quiet = [], False, 0.0
    while True:
        if len(pool) < size and (not said_ready or not select.select([sock], [], [], quiet)[0]):
            got = _dlrun_fork(sock, libc, agent, None, [], pool)
            if got[0] == "child":
                return got[1]  # in the ready process, once it was handed a request
            if got[1]:
                pool.append(got[1])
                quiet = 0.0
                continue
            quiet = 0.5
        if not said_ready:
            sock.send(b"ready")
            said_ready = True
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 16)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # the agent is gone
        pid = None
        while pool and pid is None:
            pid = _dlrun_hand_over(pool.pop(0), msg, fds)
        if pid is None:
            got = _dlrun_fork(sock, libc, agent, msg, fds, pool)
            if got[0] == "child":
                return got[1]
            pid = got[1]
        for d in fds:
            os.close(d)
        sock.send(b"pid %d" % pid if pid else b"error the fork failed")
        quiet = 0.5
def _dlrun_fork(sock, libc, agent, msg, fds, pool):
    """Two forks: a middle process forks the worker and goes, so that the worker becomes the
    agent's child (a subreaper). In the server: ("server", the worker's pid or None) for a
    request; without one (msg None), ("server", a ready process (the middle's pid, its pid,
    the socket to it) or None), the middle left as a small `sleep` that the server kills at the
    hand-over. In the worker: ("child", what _dlrun_forked returns)."""
    import signal, socket, warnings
    r, w = os.pipe()
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if msg is None else (None, None)
    with warnings.catch_warnings():  # 3.12+: numpy's BLAS thread is known and harmless
        warnings.simplefilter("ignore", DeprecationWarning)
        mid = os.fork()
        if mid == 0:
            os.close(r)
            for _, _, other in pool:
                other.detach()  # closed below by number; never again by a collected object
            pool.clear()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                if msg is None:
                    here.close()
                    msg, fds = _dlrun_await_hand_over(sock, there)
                return ("child", _dlrun_forked(sock, libc, agent, msg, fds))
            if msg is not None:
                try:
                    os.setpgid(pid, pid)
                except OSError:
                    pass
            os.write(w, b"%d" % pid)
            if msg is not None:
                os._exit(0)
            # Ready: the worker stays this process' child until it is handed a request, and
            # this one sheds the interpreter's memory (its exit would take ~30 ms then).
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the server
            try:
                os.execv("/bin/sleep", ["sleep", "2147483647"])
            except OSError:
                while True:
                    os.pause()
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read()
    if msg is not None:
        os.waitpid(mid, 0)
        return ("server", int(got) if got else None)
    there.close()
    if not got:
        here.close()
        os.waitpid(mid, 0)
        return ("server", None)
    return ("server", (mid, int(got), here))
def _dlrun_hand_over(ready, msg, fds):
    """A request to a ready process; its pid once it is the agent's child, None if it is gone."""
    import socket, signal
    mid, pid, here = ready
    try:
        socket.send_fds(here, [msg], fds)
        ok = here.recv(16) == b"ok"
    except OSError:
        ok = False
    here.close()
    try:
        os.kill(mid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(mid, 0)  # the ready process now is the agent's
    return pid if ok else None
def _dlrun_await_hand_over(sock, there):
    """In a ready process: its request (and fds) from the server; it goes with the server."""
    import socket
    sock.close()
    _dlrun_close_fds_but({0, 1, 2, there.fileno()})
    try:
        msg, fds, _, _ = socket.recv_fds(there, 1 << 20, 16)
    except OSError:
        os._exit(0)
    if not msg:
        os._exit(0)  # the server is gone
    try:
        os.setpgid(0, 0)
        there.send(b"ok")
    except OSError:
        os._exit(0)
    there.close()
    return msg, fds
def _dlrun_close_fds_but(keep):
    keep = sorted(keep)
    for lo, hi in zip(keep, keep[1:] + [1 << 20]):
        os.closerange(lo + 1, hi)
def _dlrun_forked(sock, libc, agent, msg, fds):
    import fcntl, io, time
    sock.close()
    fields = msg.split(b"\0")
    kind, cpus, targets = fields[0], fields[1], [int(t) for t in fields[2].split(b",")]
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    # The middle process' exit hands this one to the agent (a subreaper): it dies with it.
    deadline = time.monotonic() + 10
    while os.getppid() != agent and time.monotonic() < deadline:
        time.sleep(0.0002)
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != agent:
        os._exit(137)
    high = [fcntl.fcntl(d, fcntl.F_DUPFD_CLOEXEC, max(targets) + 1) for d in fds]
    for d, t in zip(high, targets):
        os.dup2(d, t)
        os.close(d)
    _dlrun_close_fds_but(set(targets) | {0, 1, 2})
    if cpus:
        os.sched_setaffinity(0, [int(c) for c in cpus.split(b",")])
    _dlrun_set_environ(fields[3:])
    report = sys.modules.get("dlrun_report")
    if report is not None and hasattr(report, "_from_environment"):
        report._from_environment()
    # The streams as a fresh interpreter opens them on these fds (a terminal: line-buffered).
    unbuffered = sys.stdout.write_through or bool(os.environ.get("PYTHONUNBUFFERED"))  # or -u
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        new = io.TextIOWrapper(open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False),
                               encoding=old.encoding, errors=old.errors, write_through=unbuffered,
                               line_buffering=name == "stderr" or os.isatty(fd))
        setattr(sys, name, new)
        setattr(sys, "__%s__" % name, new)
    np = sys.modules.get("numpy")
    if np is not None:  # its global generator is seeded at import: each process its own, as cold
        try:
            np.random.seed()
        except Exception:
            pass
    return targets[-1] if kind == b"S" else -1
_dlrun_server = os.environ.pop("{FORK_SERVER_FD}", None)
_dlrun_warming = None
if _dlrun_server is not None:
    fd = _dlrun_serve(int(_dlrun_server))
else:
    fd = int(os.environ.pop("{SPARE_FD}"))
def _dlrun_warm():
    # At idle priority (this thread only): the imports take CPU-seconds that the running
    # workers, often pinned to the same cores, would otherwise lose while they train.
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except Exception:
        pass
    try:
        import torch, torch.distributed, torch.nn.parallel
        import torch._dynamo
    except Exception:
        pass
if _dlrun_server is None:
    _dlrun_warming = threading.Thread(target=_dlrun_warm, name="dlrun-warm", daemon=True)
    _dlrun_warming.start()
if fd >= 0:
    data = bytearray()
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    if not data:
        os._exit(0)
    _dlrun_set_environ(bytes(data).split(b"\0"))
    del data, chunk
# Promoted before the imports finished: they must not go on at idle priority on a busy node (a
# spare is never slower than no spare). Raised to normal priority where allowed (CAP_SYS_NICE,
# or RLIMIT_NICE); else, when the imports get under a quarter of a CPU, this process becomes a
# cold start (the same pid, its command line without this bootstrap).
if _dlrun_warming is not None and _dlrun_warming.is_alive():
    def _dlrun_cpu_s(tid):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                rest = f.read().rpartition(")")[2].split()
            return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None
    _tid = _dlrun_warming.native_id
    try:
        os.sched_setscheduler(_tid, os.SCHED_OTHER, os.sched_param(0))
        sys.stderr.write("dlrun: the warm spare was promoted before its imports finished; "
                         "they go on at normal priority\n")
    except OSError:
        import time
        while _dlrun_warming.is_alive():
            _before = _dlrun_cpu_s(_tid)
            _dlrun_warming.join(0.2)
            _after = _dlrun_cpu_s(_tid)
            if (_dlrun_warming.is_alive() and _before is not None and _after is not None and
                    _after - _before < 0.05):
                sys.stderr.write(f"dlrun: the warm spare's imports got {(_after - _before) / 0.2:.0%} "
                                 "of a CPU at idle priority (a busy node): starting cold instead\n")
                sys.stderr.flush()
                _orig = getattr(sys, "orig_argv", [sys.executable, "-c"])
                _flags = _orig[1:_orig.index("-c")] if "-c" in _orig else []
                os.execv(sys.executable, [_orig[0]] + _flags + sys.argv[1:])
if _dlrun_warming is not None:
    _dlrun_warming.join()
    _dlrun_freeze()
del _dlrun_warming, _dlrun_warm, _dlrun_server, _dlrun_set_environ, _dlrun_freeze
# Threads the imports started (a pool, a watchdog) inherited their idle priority, and would keep
# it in the worker: every thread of a promoted spare goes to normal priority where allowed.
# (No /proc, as in a chroot entered by hand: nothing to list, and the spare was raised above.)
try:
    _tids = os.listdir("/proc/self/task")
except OSError:
    _tids = []
for _t in _tids:
    try:
        if os.sched_getscheduler(int(_t)) == os.SCHED_IDLE:
            os.sched_setscheduler(int(_t), os.SCHED_OTHER, os.sched_param(0))
    except (OSError, ValueError):
        pass
del _tids
# Ranks other than 0 meet rank 0's TCPStore. Promoted together, one may get there before rank 0
# has bound it, and TCPStore's client then backs off for up to a second: wait for the port first.
try:
    # The module (torch.distributed.rendezvous is also the name of its function, which
    # `from torch.distributed import rendezvous` gives: then this patch never took effect).
    _rdzv = sys.modules["torch.distributed.rendezvous"]
    def _dlrun_store_wait(create):
        def wait_then_create(hostname, port, rank, world_size, timeout, *args, **kwargs):
            if rank != 0:
                try:  # dlrun's one wait-for-port helper (python/, on PYTHONPATH under dlrun)
                    from dlrun_step import await_store
                    await_store(hostname, port, min(timeout.total_seconds(), 60.0))
                except ImportError:
                    pass  # without it, TCPStore's own client backs off instead
            return create(hostname, port, rank, world_size, timeout, *args, **kwargs)
        return wait_then_create
    _rdzv._create_c10d_store = _dlrun_store_wait(_rdzv._create_c10d_store)
except Exception:
    pass
import runpy
args = sys.argv[1:]
if args[0] == "-m":
    sys.argv = args[1:]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
else:
    # As `python SCRIPT` (3.9+): __file__ absolute, sys.argv[0] as given, sys.path[0] the
    # script's directory, run in the real __main__ module (so pickling its classes works).
    def _dlrun_run_script(script):
        path = os.path.abspath(script)
        sys.argv = args
        sys.path[0] = os.path.dirname(path)
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        g = sys.modules["__main__"].__dict__
        builtins = g["__builtins__"]
        g.clear()
        g.update(__name__="__main__", __file__=path, __cached__=None, __doc__=None,
                 __loader__=None, __package__=None, __spec__=None, __builtins__=builtins)
        exec(code, g)
    _dlrun_run_script(args[0])
