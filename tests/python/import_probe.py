"""Prints where `import dlrun` and `import dlrun_report` come from, and that the package
re-exports the helper."""
import dlrun
import dlrun_report

assert dlrun.timed is dlrun_report.timed and dlrun.report is dlrun_report
print("dlrun from", dlrun.__file__)
print("dlrun_report from", dlrun_report.__file__)
