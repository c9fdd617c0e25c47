#!/usr/bin/env bash
# Issue #16: an elastic 2-node job (`dlrun slurm --nodes 2 --min-nodes 1`) whose first node's
# agent, the one hosting the rendezvous, is SIGKILLed mid-training. The second node's agent takes
# over the rendezvous (epoch 2), restarts its workers alone and finishes every planned step from
# the newest checkpoint; Slurm keeps the job (no --kill-on-bad-exit, --no-kill).
source "$(dirname "$0")/lib.sh"

"$DLRUN" slurm --nodes 2 --min-nodes 1 --nproc-per-node 2 --time 10 --rdzv-port "$(free_port)" \
  -o job.sbatch -- "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 \
  --local-batch-size 1 --max-steps 16 --checkpoint-dir "$work/ckpt" --checkpoint-every 4 \
  --metrics-json "$work/m.json" 2>/dev/null
grep -q -- '--nnodes "1:$SLURM_JOB_NUM_NODES"' job.sbatch || fail "the script is not elastic"
submit job.sbatch 300
wait_for_line "$out" "checkpoint saved at step 4" 120

# The agent that hosts the rendezvous: the one on the allocation's first node (SLURM_NODEID=0).
host_agent=""
for pid in $(pgrep -f "^$DLRUN .*--rdzv-id $jid( |$)"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_NODEID=0"; then
    host_agent=$pid
  fi
done
[[ -n "$host_agent" ]] || fail "no dlrun agent with SLURM_NODEID=0 for job $jid"
grep -q "hosting the rendezvous" "$out" || fail "nobody said it hosts the rendezvous"
mark=$(($(wc -l <"$out") + 1))
kill -KILL "$host_agent"
echo "killed the hosting agent, pid $host_agent"

wait_for_line "$out" "taking over the rendezvous at .* \(epoch 2\)" 60
rc=0
wait "$submit_pid" || rc=$?
echo "sbatch --wait: $rc (srun passes on the killed agent's status)"

after=$(tail -n "+$mark" "$out")
grep -q -E "restart [0-9]+: node 0 of 1" <<<"$after" || fail "the survivor did not restart alone"
grep -q -E "resumed from step (4|8|12)" <<<"$after" || fail "no resume from a checkpoint"
grep -q "all 2 worker(s) finished" <<<"$after" || fail "the survivor's workers did not finish"
grep -q '"steps": 16' m.json || fail "metrics: the planned 16 steps"
start=$(sed -n 's/.*"start_step": \([0-9]*\).*/\1/p' m.json)
((start >= 4)) || fail "final run started at step $start, expected >= 4"
state=$(sacct -n -X -j "$jid" -o State 2>/dev/null | head -n 1 | tr -d ' ')
pass "host agent killed; the second node took over (epoch 2), resumed at step $start, 16 steps; job state ${state:-unknown}"
