"""dlrun's Python helper as a package: `import dlrun` gives what `import dlrun_report` gives
(report_step, report_resume, timed, heartbeat, pause, done, Preemption,
dump_collectives_on_failure), and dlrun.Recoverable, the in-process recovery of
dlrun_recovery.py (imported when first used).

The code lives in the single standard-library file dlrun_report.py next to this package, kept
for offline clusters (copy it anywhere on PYTHONPATH, or rely on dlrun, which puts its copy on
the workers' PYTHONPATH). Its one distribution is the `dlrun` wheel (`pip install dlrun`: the
launcher and this helper together); scripts/install-torch copies it into the project's
environment.
"""
import dlrun_report as report
from dlrun_report import (
    Preemption,
    done,
    dump_collectives_on_failure,
    heartbeat,
    pause,
    report_resume,
    report_step,
    timed,
)

__all__ = [
    "Preemption",
    "done",
    "dump_collectives_on_failure",
    "heartbeat",
    "pause",
    "report",
    "report_resume",
    "report_step",
    "timed",
]
__version__ = "0.21.0"


def __getattr__(name):
    # dlrun.Recoverable (dlrun_recovery.py) imports torch: only when asked for.
    if name in ("Recoverable", "is_replacement"):
        import dlrun_recovery
        return getattr(dlrun_recovery, name)
    raise AttributeError("module 'dlrun' has no attribute %r" % name)
