#!/usr/bin/env bash
# In a 2-node Slurm job, SIGKILL of one train_unet worker mid-training: train_unet declares
# in-process recovery, so only the lost rank starts again (a warm spare) and takes the state from
# a peer while the other three keep running; no round opens, no checkpoint is read, and the job
# completes its 16 steps (docs/RECOVERY.md, "Across nodes"). The restart from a checkpoint across
# nodes is host_loss.sh's and container_job.sh's.
source "$(dirname "$0")/lib.sh"

"$DLRUN" slurm --nodes 2 --nproc-per-node 2 --time 10 --rdzv-port "$(free_port)" -o job.sbatch \
  -- "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 --local-batch-size 1 \
  --max-steps 16 --checkpoint-dir "$work/ckpt" --checkpoint-every 4 \
  --metrics-json "$work/m.json" 2>/dev/null
submit job.sbatch 300
wait_for_line "$out" "checkpoint saved at step 4" 120
# A worker from the agents' rank tables (warm spares run the same command line).
victim=$(awk '/local_rank  rank  pid/ {t=1; next} t && NF==3 && $2 == 2 {print $3; exit}' "$out")
[[ -n "$victim" ]] || fail "no rank 2 in the rank tables"
kill -KILL "$victim"
echo "killed rank 2, pid $victim"
finish

n=$(count "in-process recovery: .*\(generation 1, master port" "$out")
((n == 2)) || fail "$n agent(s) began generation 1, expected both"
n=$(count "in-process recovery done: every rank holds the state" "$out")
((n == 2)) || fail "$n agent(s) saw the recovery end, expected both"
grep -q "rank 2 (local rank 0, pid $victim)" "$out" || fail "no line names the lost rank 2"
! grep -q -E "restart 1: node|resumed from step" "$out" || fail "a restart or a checkpoint read"
grep -q '"steps": 16' m.json || fail "metrics: the planned 16 steps"
grep -q '"start_step": 0' m.json || fail "metrics: the run did not start at step 0 once"
pass "rank 2 (pid $victim) replaced in process on a 2-node Slurm job; no restart, 16 steps"
