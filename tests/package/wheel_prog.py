# Run by dlrun from the wheel inside a clean root (tests/package/wheel_test.sh): each worker
# writes what it was given, and checks that dlrun's helper is importable as dlrun puts it there.
import os
import sys

import dlrun_report  # on the workers' PYTHONPATH from share/dlrun/python beside bin/dlrun

out = sys.argv[1]
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID"]
line = " ".join("%s=%s" % (k, os.environ.get(k, "")) for k in keys)
dlrun_report.report_step(0, samples=1, step_s=0.01)
with open(os.path.join(out, "rank-%s" % os.environ["RANK"]), "w") as f:
    f.write("%s python=%s\n" % (line, sys.executable))
