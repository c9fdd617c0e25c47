#!/usr/bin/env bash
# A --preemptible job that gets SIGUSR1 (as from --signal=USR1@90, here via scancel -s USR1)
# checkpoints, requeues itself (rank 0 runs scontrol requeue) and the requeued run finishes,
# its step count continuing from the checkpoint.
source "$(dirname "$0")/lib.sh"

"$DLRUN" slurm --nodes 2 --nproc-per-node 2 --time 10 --preemptible --rdzv-port "$(free_port)" \
  -o job.sbatch -- "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 \
  --local-batch-size 1 --max-steps 16 --checkpoint-dir "$work/ckpt" --checkpoint-every 100 \
  --metrics-json "$work/m.json" 2>/dev/null
grep -q -- "--signal=USR1@90" job.sbatch || fail "no --signal in the script"
grep -q -- "--requeue" job.sbatch || fail "no --requeue in the script"
submit job.sbatch 360
wait_for_line "$out" "step 3/16" 120
scancel -s USR1 "$jid"
wait_for_line "$out" "requeueing Slurm job $jid after the checkpoint at step" 60
finish
scontrol show job "$jid" | grep -q "Restarts=1" || fail "Slurm does not count one requeue"

ckpt_step=$(sed -n "s/.*requeueing Slurm job $jid after the checkpoint at step \([0-9]*\).*/\1/p" "$out")
grep -q "dlrun: job $jid (restart 1)" "$out" || fail "the requeued run did not start"
grep -q "resumed from step $ckpt_step" "$out" || fail "the requeued run did not resume from step $ckpt_step"
grep -q '"steps": 16' m.json || fail "metrics: the planned 16 steps"
grep -q "\"start_step\": $ckpt_step" m.json || fail "metrics: start step $ckpt_step"
pass "checkpoint at step $ckpt_step, requeued, resumed, 16 steps"
