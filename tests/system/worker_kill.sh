#!/usr/bin/env bash
# In a 2-node job, SIGKILL of one worker mid-training restarts the workers on both nodes and the
# job completes, resumed from the newest checkpoint (the step count continues).
source "$(dirname "$0")/lib.sh"

"$DLRUN" slurm --nodes 2 --nproc-per-node 2 --time 10 --rdzv-port "$(free_port)" -o job.sbatch \
  -- "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 --local-batch-size 1 \
  --max-steps 16 --checkpoint-dir "$work/ckpt" --checkpoint-every 4 \
  --metrics-json "$work/m.json" 2>/dev/null
submit job.sbatch 300
wait_for_line "$out" "checkpoint saved at step 4" 120
victim=$(pgrep -f "^$TRAIN_UNET .*$work/ckpt" | head -n 1)
[[ -n "$victim" ]] || fail "no worker process found"
kill -KILL "$victim"
echo "killed worker pid $victim"
finish

grep -q "restart 1: node 0 of 2" "$out" || fail "node 0 did not restart its workers"
grep -q "restart 1: node 1 of 2" "$out" || fail "node 1 did not restart its workers"
grep -q -E "resumed from step (4|8|12)" "$out" || fail "no resume from a checkpoint"
grep -q '"steps": 16' m.json || fail "metrics: the planned 16 steps"
start=$(sed -n 's/.*"start_step": \([0-9]*\).*/\1/p' m.json)
((start >= 4)) || fail "final run started at step $start, expected >= 4"
pass "restart on both nodes, resumed at step $start, 16 steps"
