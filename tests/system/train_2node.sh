#!/usr/bin/env bash
# dlrun slurm --nodes 2 + sbatch on the two-node cluster: one agent per node x 2 workers,
# ranks 0..3 exactly once, training finishes, epoch throughput lines in the job's output.
source "$(dirname "$0")/lib.sh"

"$MAKE_UNET_DATA" data.h5 64 3 >/dev/null
"$DLRUN" slurm --nodes 2 --nproc-per-node 2 --time 10 --rdzv-port "$(free_port)" -o job.sbatch \
  -- "$TRAIN_UNET" --yaml-config "$SOURCE_DIR/examples/unet/config/UNet.yaml" --config cpu_tiny \
  --base-channels 4 --local-batch-size 1 --data "$work/data.h5" --metrics-json "$work/m.json" \
  2>/dev/null
submit job.sbatch 300
finish

grep -q "node 0 of 2, world size 4" "$out" || fail "no agent on node 0"
grep -q "node 1 of 2, world size 4" "$out" || fail "no agent on node 1"
[[ $(ranks_in_tables "$out") == "0 1 2 3 " ]] || fail "ranks in the tables: '$(ranks_in_tables "$out")', expected 0 1 2 3 once each"
[[ $(count "Time taken for epoch [12] is .* samples/sec" "$out") == 2 ]] || fail "expected 2 epoch lines"
[[ $(count "all 2 worker\(s\) finished successfully" "$out") == 2 ]] || fail "both agents must finish"
grep -q '"world_size": 4' m.json || fail "metrics: world size"
grep -q '"steps": 4' m.json || fail "metrics: steps"
# The two agents really ran under different slurmd "nodes".
grep -q "dlrun: job [0-9]* (restart 0) on 2 node(s) \[node\[1-2\]\]" "$out" || fail "job header"
pass "4 ranks on 2 nodes, 2 epochs"
