#!/usr/bin/env bash
# a network partition heals into one job. Two agents in two network namespaces (a
# veth pair, their own addresses), elastic 1:2, with the candidate list "A:port,B:port". The
# host A's link goes down for longer than the liveness limit: B takes over the rendezvous with
# epoch 2 and trains alone, and A (still hosting epoch 1) trains alone too. When the link comes
# back, A's probe learns of epoch 2, A steps down, and its agent re-joins B: the last round has
# both nodes and four distinct ranks, and both agents finish the planned steps (docs/FAILOVER.md).
# Not a Slurm test: it only needs root and iproute2.
set -euo pipefail
: "${DLRUN:?}" "${TRAIN_UNET:?}"
source "$(dirname "$0")/common.sh"  # follow_until, netns_pair
work=$(mktemp -d /var/tmp/dlrun-partition.XXXXXX)
id=$$
on_exit 'netns_pair_down'
fail() {
  dlrun_failed=1
  echo "FAIL (partition): $*" >&2
  for f in "$work"/a.log "$work"/b.log; do
    [[ -e "$f" ]] && { echo "--- $f (dlrun lines)" >&2; grep -v '^\[rank' "$f" | tail -n 40 >&2; }
  done
  exit 1
}
netns_pair pa

port=29400
steps=150
agent() {  # agent NS ADDR LOG
  ip netns exec "$1" env OMP_NUM_THREADS=1 DLRUN_RDZV_TOKEN="partition-$id" \
    timeout 400 "$DLRUN" --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d \
    --rdzv-endpoint "$addr_a:$port,$addr_b:$port" --rdzv-id "part$id" --local-addr "$2" \
    --rdzv-conf "last_call_timeout=1,heartbeat_interval=0.5,heartbeat_misses=4" \
    --max-restarts 10 --grace-period 2 -- \
    "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 --local-batch-size 1 \
    --max-steps "$steps" --checkpoint-dir "$work/ckpt" --checkpoint-every 5 \
    --metrics-json "$work/m.json" >"$3" 2>&1
}
agent "$ns_a" "$addr_a" "$work/a.log" & pa=$!
follow_until "$work/a.log" "hosting the rendezvous on $addr_a:$port" 60 || fail "A did not host"
agent "$ns_b" "$addr_b" "$work/b.log" & pb=$!
follow_until "$work/a.log" "checkpoint saved at step 10" 180 || fail "no training before the cut"

# The cut: A's link down for longer than the liveness limit (0.5 s x 4 = 2 s), until B has
# taken over with epoch 2 and trained a step alone.
mark_b=$(($(wc -l <"$work/b.log") + 1))
ip -n "$ns_a" link set "$link_a" down
echo "cut A's link at $(date +%T.%N)"
follow_until "$work/b.log" "taking over the rendezvous at $addr_b:$port \(epoch 2\)" 60 "$mark_b" ||
  fail "B did not take over"
follow_until "$work/b.log" "restart [0-9]+: node 0 of 1" 60 "$mark_b" || fail "B did not run alone"
mark_a=$(($(wc -l <"$work/a.log") + 1))
ip -n "$ns_a" link set "$link_a" up
echo "healed at $(date +%T.%N)"

# A learns of epoch 2, steps down and joins B; the next round has both nodes.
follow_until "$work/a.log" "joining the newer rendezvous host at $addr_b:$port|stepped down" 60 \
  "$mark_a" || fail "A did not step down after the heal"
follow_until "$work/a.log" "restart [0-9]+: node [01] of 2" 120 "$mark_a" ||
  fail "A did not re-join as one of 2 nodes"
rca=0; rcb=0
wait "$pa" || rca=$?
wait "$pb" || rcb=$?
((rca == 0)) || fail "A exited with $rca"
((rcb == 0)) || fail "B exited with $rcb"
# The last rank tables of the two agents cover ranks 0-3 once each (one job, not two).
last_table() {
  awk '/local_rank  rank  pid/ {t=1; n=0; delete r; next}
       t && NF==3 && $1 ~ /^[0-9]+$/ {r[n++]=$2; next} {t=0}
       END {for (i = 0; i < n; i++) print r[i]}' "$1"
}
ranks=$( (last_table "$work/a.log"; last_table "$work/b.log") | sort -n | tr '\n' ' ')
[[ "$ranks" == "0 1 2 3 " ]] || fail "last ranks after the heal: '$ranks', expected 0 1 2 3"
grep -q "\"steps\": $steps" "$work/m.json" || fail "metrics: the planned $steps steps"
grep -q '"world_size": 4' "$work/m.json" || fail "metrics: the last run was not one 4-rank job"
echo "PASS (partition): B took over at epoch 2 during the cut; after the heal A stepped down and the job ended as one 4-rank job"
rm -rf "$work"
