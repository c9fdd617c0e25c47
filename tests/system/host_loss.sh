#!/usr/bin/env bash
# an elastic 2-node job (`dlrun slurm --nodes 2 --min-nodes 1`) whose agent hosting
# the rendezvous is SIGKILLed mid-training. The other node's agent takes over the rendezvous
# (epoch 2), restarts its workers alone and finishes every planned step from the newest
# checkpoint; Slurm keeps the job (no --kill-on-bad-exit, --no-kill). The job finished, so Slurm
# must record it so: the script exits 0 though srun passes on the killed agent's 137
# (JobState=COMPLETED, ExitCode=0:0), or afterok chains would take it for a failure.
source "$(dirname "$0")/lib.sh"

port=$(free_port)
"$DLRUN" slurm --nodes 2 --min-nodes 1 --nproc-per-node 2 --time 10 --rdzv-port "$port" \
  -o job.sbatch -- "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 \
  --local-batch-size 1 --max-steps 16 --checkpoint-dir "$work/ckpt" --checkpoint-every 4 \
  --metrics-json "$work/m.json" 2>/dev/null
grep -q -- '--nnodes "1:$SLURM_JOB_NUM_NODES"' job.sbatch || fail "the script is not elastic"
submit job.sbatch 300
wait_for_line "$out" "checkpoint saved at step 4" 120

# The agent that hosts the rendezvous: the one listening on the rendezvous port. On a real
# cluster that is the first node's; here both "nodes" are 127.0.0.1, so whichever agent bound
# the port first hosts.
host_agent=$(ss -Hltnp "sport = :$port" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2)
[[ -n "$host_agent" ]] || fail "nobody listens on the rendezvous port $port"
host_node=$(tr '\0' '\n' <"/proc/$host_agent/environ" | sed -n 's/^SLURMD_NODENAME=//p')
grep -q "hosting the rendezvous" "$out" || fail "nobody said it hosts the rendezvous"
mark=$(($(wc -l <"$out") + 1))
kill -KILL "$host_agent"
echo "killed the hosting agent, pid $host_agent on $host_node"

wait_for_line "$out" "taking over the rendezvous at .* \(epoch 2\)" 60
rc=0
wait "$submit_pid" || rc=$?
((rc == 0)) || fail "sbatch --wait: $rc for a job the survivor finished (expected 0)"
grep -q "^dlrun: srun exited [1-9][0-9]* (an agent was lost), but the job finished" "$out" \
  || fail "the script did not say why it exits 0"
state=$(scontrol show job "$jid" | grep -o -E "JobState=[A-Z_]+|ExitCode=[0-9]+:[0-9]+" | tr '\n' ' ')
[[ "$state" == *"JobState=COMPLETED"* && "$state" == *"ExitCode=0:0"* ]] \
  || fail "Slurm recorded '$state' for a finished job (expected JobState=COMPLETED ExitCode=0:0)"

after=$(tail -n "+$mark" "$out")
grep -q -E "rendezvous host .* lost: joining" <<<"$after" || fail "the survivor did not fail over"
grep -q -E "restart [0-9]+: node 0 of 1" <<<"$after" || fail "the survivor did not restart alone"
grep -q -E "resumed from step (4|8|12)" <<<"$after" || fail "no resume from a checkpoint"
grep -q "all 2 worker(s) finished" <<<"$after" || fail "the survivor's workers did not finish"
# The restart ledger (tests/system/lost_time.sh checks its sums): the C++ trainer's checkpoint
# manager told the agent where it resumed from.
resumed=$(sed -n 's/.*resumed from step \([0-9]*\) (.*/\1/p' <<<"$after" | head -n 1)
grep -q -E "^  restart 1: .*; [0-9.]+ s lost \(on .*\(resumed from step $resumed\)" <<<"$after" \
  || fail "the report's restart 1 has no cost, or not the resume from step $resumed"
grep -q -E "job report: succeeded .*, 2 rank\(s\) on 1 node\(s\) \(at most 4 on 2\)" <<<"$after" \
  || fail "the report does not give the job's shape before and after the loss"
grep -q '"steps": 16' m.json || fail "metrics: the planned 16 steps"
start=$(sed -n 's/.*"start_step": \([0-9]*\).*/\1/p' m.json)
((start >= 4)) || fail "final run started at step $start, expected >= 4"
pass "host agent on $host_node killed; the other node took over (epoch 2), resumed at step $start, 16 steps; Slurm: $state"
