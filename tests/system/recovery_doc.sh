#!/usr/bin/env bash
# The Python loop of docs/RECOVERY.md ("Python programs: the checklist") as the docs print it: run
# under dlrun with the default flags without a fault, then with rank 1 SIGKILLed once rank 0 has
# said a step of the second epoch (wherever rank 1 is then: in a step, between two, at the
# epoch's end). The faulted run must recover in process and end with every rank's final loss
# equal, bit for bit, to the run without the fault.
# Environment: DLRUN, SOURCE_DIR, TEST_PYTHON.
set -euo pipefail
test_name=recovery_doc
source "$(dirname "$0")/common.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-recovery-doc.XXXXXX")
on_exit 'rm -rf "$work"'
export PYTHON_EXEC=$TEST_PYTHON PYTHONPATH=$SOURCE_DIR/python OMP_NUM_THREADS=1
# The first ```python block after the checklist's heading.
awk '/^## Python programs: the checklist/ {s=1} s && /^```python/ {p=1; next} p && /^```/ {exit} p' \
  "$SOURCE_DIR/docs/RECOVERY.md" >"$work/train.py"
[[ -s "$work/train.py" ]] || { echo "FAIL ($test_name): no python block in the checklist" >&2; exit 1; }

mkdir -p "$work/clean" "$work/fault"
(cd "$work/clean" && timeout 300 "$DLRUN" --nproc-per-node 2 "$work/train.py" >out 2>&1) ||
  fail_with_dlrun_lines "$test_name" "the docs' loop without a fault failed" "$work/clean/out"
(cd "$work/fault" && exec timeout 300 "$DLRUN" --nproc-per-node 2 "$work/train.py" >out 2>&1) &
job=$!
follow_until "$work/fault/out" "step (2[4-9]|3[0-9]) loss" 120 ||
  fail_with_dlrun_lines "$test_name" "no step of the second epoch within 120 s" "$work/fault/out"
mapfile -t pids < <(first_pids "$work/fault/out")
kill -KILL "${pids[1]}"
rc=0
wait "$job" || rc=$?
((rc == 0)) || fail_with_dlrun_lines "$test_name" "the faulted run ended with $rc" "$work/fault/out"
grep -q "in-process recovery done" "$work/fault/out" ||
  fail_with_dlrun_lines "$test_name" "not recovered in process" "$work/fault/out"
finals() { grep -o 'rank [0-9] final loss .*' "$1" | sort; }
[[ -n "$(finals "$work/clean/out")" && "$(finals "$work/fault/out")" == "$(finals "$work/clean/out")" ]] ||
  fail_with_dlrun_lines "$test_name" "the faulted run ended other than without the fault:
$(finals "$work/fault/out")
against
$(finals "$work/clean/out")" "$work/fault/out"
echo "recovery doc ok: $(grep -o 'state of step [0-9]*' "$work/fault/out" | head -1) recovered in process; $(finals "$work/fault/out" | tr '\n' ' ')"
