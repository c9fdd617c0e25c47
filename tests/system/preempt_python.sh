#!/usr/bin/env bash
# Preemption for a Python program: a --preemptible job of tests/system/preempt_train.py (gloo,
# dlrun_report.Preemption) gets SIGUSR1 (as from --signal=USR1@90; here scancel -s USR1). Every
# rank agrees to stop at one step, rank 0 checkpoints and requeues the job, and the requeued run
# resumes from that step and finishes.
source "$(dirname "$0")/lib.sh"
: "${TEST_PYTHON:?}"

cp "$SOURCE_DIR/tests/system/preempt_train.py" train.py
"$DLRUN" slurm --nodes 2 --nproc-per-node 2 --time 10 --preemptible --rdzv-port "$(free_port)" \
  -o job.sbatch -- "$TEST_PYTHON" "$work/train.py" 60 "$work/ckpt.json" 2>submit.warn
grep -q "warning" submit.warn && fail "a program with the hook got a warning: $(cat submit.warn)"
submit job.sbatch 360
wait_for_line "$out" "step 3/60" 180
scancel -s USR1 "$jid"
wait_for_line "$out" "requeueing Slurm job $jid after the checkpoint at step" 60
finish
scontrol show job "$jid" | grep -q "Restarts=1" || fail "Slurm does not count one requeue"

ckpt_step=$(sed -n "s/.*requeueing Slurm job $jid after the checkpoint at step \([0-9]*\).*/\1/p" "$out")
grep -q "dlrun: job $jid (restart 1)" "$out" || fail "the requeued run did not start"
grep -q "resumed from step $ckpt_step" "$out" || fail "the requeued run did not resume from step $ckpt_step"
grep -q "no handler for it" "$out" && fail "dlrun said a rank had no handler for SIGUSR1"
# Every rank stopped at the same step: no rank went on alone (the gloo all-reduce would hang).
[[ $(count "step $((ckpt_step + 1))/60" "$out") == 1 ]] || fail "step $((ckpt_step + 1)) must run once (after the resume)"
grep -q '"start": '"$ckpt_step" ckpt.json.done || fail "the finished run did not start at $ckpt_step: $(cat ckpt.json.done 2>&1)"
pass "Python: checkpoint at step $ckpt_step, requeued, resumed, 60 steps"
