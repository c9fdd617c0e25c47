# The warm spare's bootstrap (dlrun --warm-spares, launcher/app/plan.cc WarmSpareArgv), run as
# `python [FLAGS] -c <this> SCRIPT|-m MODULE ARGS...` with {SPARE_FD} replaced by the name of
# the variable that holds the fd the worker's environment arrives on (common/contract.h).
# Compiled into dlrun (launcher/CMakeLists.txt), so nothing is read at run time.
#
# A thread at idle priority imports torch (the slow part of a
# Python worker's start) and torch._dynamo (PyTorch 2.x's DistributedDataParallel imports it,
# with sympy and ~900 modules, when the first one is built: ~1 s that a promoted spare would
# otherwise spend after the fault), so the spare takes no CPU from the workers it stands beside.
# The main thread waits for the worker's environment on contract::kSpareFd, replaces the
# environment, then waits for the imports (raised to normal priority, or replaced by a cold
# start when they are starved), makes a rank other than 0 wait for rank 0's store port
# before its TCPStore client connects, and runs the script as `python SCRIPT` does (or the
# module, as `python -m`).
import os, sys, threading
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
_dlrun_warming = threading.Thread(target=_dlrun_warm, name="dlrun-warm", daemon=True)
_dlrun_warming.start()
data = bytearray()
while True:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        break
    data += chunk
os.close(fd)
if not data:
    os._exit(0)
os.environ.clear()
for kv in bytes(data).split(b"\0"):
    key, eq, value = kv.partition(b"=")
    if key and eq:
        os.environb[key] = value
del data, chunk
# Promoted before the imports finished: they must not go on at idle priority on a busy node (a
# spare is never slower than no spare). Raised to normal priority where allowed (CAP_SYS_NICE,
# or RLIMIT_NICE); else, when the imports get under a quarter of a CPU, this process becomes a
# cold start (the same pid, its command line without this bootstrap).
if _dlrun_warming.is_alive():
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
_dlrun_warming.join()
del _dlrun_warming, _dlrun_warm
# Threads the imports started (a pool, a watchdog) inherited their idle priority, and would keep
# it in the worker: every thread of a promoted spare goes to normal priority where allowed.
for _t in os.listdir("/proc/self/task"):
    try:
        if os.sched_getscheduler(int(_t)) == os.SCHED_IDLE:
            os.sched_setscheduler(int(_t), os.SCHED_OTHER, os.sched_param(0))
    except (OSError, ValueError):
        pass
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
