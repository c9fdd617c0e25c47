"""A rank that wants a CPU and gets none (DlrunHang.AStarvedRankIsNoHang): pinned to the CPU
given in STARVE_CPU, where the test runs a spinning process, at SCHED_IDLE, so it is runnable
and almost never runs. It then does a fixed amount of work and exits 0. It never heartbeats, so
with --hang-timeout only the whole-group idle rule judges it: a rank waiting for a CPU is not
idle."""
import os
import sys

cpu = int(os.environ["STARVE_CPU"])
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
print("starved_probe: starving", flush=True)
total = 0
for i in range(3_000_000):
    total += i
print(f"starved_probe: done ({total})", flush=True)
sys.exit(0)
