#!/usr/bin/env bash
# Slurm's preemption warning (`#SBATCH --signal=USR1@90`, or `scancel -s USR1`) sent to dlrun run
# by hand in a Slurm job, without --signals-to-handle: it is passed on to the workers and the job
# goes on (SIGUSR1's default action ended dlrun with rc 138). Outside Slurm the default list is
# torchrun's, unchanged (not tested here: it ends dlrun as it ends torchrun).
# Environment: DLRUN, SOURCE_DIR, TEST_PYTHON.
set -euo pipefail
test_name=slurm_usr1
source "$(dirname "$0")/common.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-usr1.XXXXXX")
on_exit 'rm -rf "$work"'
export PYTHON_EXEC=$TEST_PYTHON
# SLURM_JOB_ID alone: dlrun --standalone in a Slurm job's shell (an interactive salloc).
SLURM_JOB_ID=4242 "$DLRUN" --standalone --nproc-per-node 2 "$SOURCE_DIR/tests/python/usr1_wait.py" \
  >"$work/out" 2>&1 &
pid=$!
on_exit "kill -9 $pid 2>/dev/null || true"
for r in 0 1; do
  follow_until "$work/out" "rank $r ready" 120 ||
    fail_with_dlrun_lines "$test_name" "rank $r never ready" "$work/out"
done
kill -USR1 "$pid"
rc=0
wait "$pid" || rc=$?
((rc == 0)) || fail_with_dlrun_lines "$test_name" "dlrun ended with rc $rc at SIGUSR1" "$work/out"
for r in 0 1; do
  grep -q "rank $r got SIGUSR1" "$work/out" ||
    fail_with_dlrun_lines "$test_name" "rank $r did not get SIGUSR1" "$work/out"
done
echo "slurm_usr1 ok: SIGUSR1 passed on to both ranks under SLURM_JOB_ID, the job ended rc 0"
