"""dlrun's --profile in a Python rank (docs/PROFILING.md): the PyTorch profiler, or CUDA's
profiler range for nsys, over the steps dlrun_report.report_step counts. Internal to
dlrun_report (beside it on the workers' PYTHONPATH and in the wheel); imports torch only when a
profile is asked for."""
import os
import sys


class Profile:
    """dlrun's --profile in this rank: DLRUN_PROFILE (the tool), DLRUN_PROFILE_STEPS ("A:B"),
    DLRUN_PROFILE_FILE (the torch trace). Captures from the end of step A-1 (from the start
    when A is 0 or no range is given) to the end of step B."""

    def __init__(self):
        self.tool = os.environ.get("DLRUN_PROFILE", "")
        self.first, self.last = 0, None
        try:
            a, b = os.environ.get("DLRUN_PROFILE_STEPS", "").split(":")
            self.first, self.last = int(a), int(b)
        except ValueError:
            pass
        self.prof = None
        self.on = False
        self.done = False
        if self.tool in ("torch", "nsys") and self.first == 0 and (self.tool == "torch" or self.last is not None):
            self._start()

    def _start(self):
        try:
            import torch
            if self.tool == "torch":
                acts = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                self.prof = torch.profiler.profile(activities=acts, record_shapes=False)
                self.prof.__enter__()
                import atexit
                atexit.register(self._stop)
            elif torch.cuda.is_available():
                torch.cuda.cudart().cudaProfilerStart()
            self.on = True
        except Exception as e:  # the training goes on without the profile
            sys.stderr.write("dlrun_report: cannot start the %s profile: %s\n" % (self.tool, e))
            self.done = True

    def _stop(self):
        if not self.on:
            return
        self.on, self.done = False, True
        try:
            if self.prof is not None:
                self.prof.__exit__(None, None, None)
                self.prof.export_chrome_trace(os.environ.get("DLRUN_PROFILE_FILE", "trace.json"))
            else:
                import torch
                torch.cuda.cudart().cudaProfilerStop()
        except Exception as e:
            sys.stderr.write("dlrun_report: cannot write the %s profile: %s\n" % (self.tool, e))

    def step(self, step):
        if self.done or self.tool not in ("torch", "nsys"):
            return
        if self.on and self.last is not None and step >= self.last:
            self._stop()
        elif not self.on and self.last is not None and self.first - 1 <= step < self.last:
            self._start()
