"""Step reports for dlrun's telemetry (docs/TELEMETRY.md), for Python training scripts.

    import dlrun_report
    for step in range(steps):
        t0 = time.monotonic()
        ...
        dlrun_report.report_step(step, samples=len(batch), step_s=time.monotonic() - t0,
                                 data_s=load_time, loss=loss.item())

One text line per step on the pipe dlrun passes in DLRUN_HEARTBEAT_FD; outside dlrun (the
variable unset) every call does nothing. Standard library only; never raises and never blocks.
"""
import math
import os

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


def report_step(step, samples, step_s, data_s=None, compute_s=None, sync_s=None, loss=None):
    """Reports one step: its number, the samples this rank processed, its wall time in s, and
    optionally the time waiting for data, computing, and in the gradient sync, and the loss."""
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


def heartbeat():
    """Tells dlrun this worker is alive (for --hang-timeout), without a step record."""
    fd = _pipe()
    if fd >= 0:
        try:
            os.write(fd, b"h")
        except OSError:
            pass
