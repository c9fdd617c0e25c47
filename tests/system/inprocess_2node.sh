#!/usr/bin/env bash
# In-process recovery across nodes (docs/RECOVERY.md, "Across nodes"): two agents in two network
# namespaces, --nnodes 2, train_unet on 2 ranks each. First rank 3 (node B) SIGKILLs itself at
# the start of a step; then, in a second job, rank 0 (node A: the rendezvous' host, and the
# store's) is SIGKILLed from outside in the middle of one. Each time the survivors on both nodes
# keep their processes, only the lost rank starts again (warm spare), no checkpoint is read, no
# round opens, and the final parameters equal those of a fault-free run of the same two nodes.
# Not a Slurm test: it only needs root and iproute2.
set -euo pipefail
: "${DLRUN:?}" "${TRAIN_UNET:?}"
source "$(dirname "$0")/common.sh"  # follow_until, netns_pair, fail_with_dlrun_lines, first_pids
work=$(mktemp -d /var/tmp/dlrun-inprocess2.XXXXXX)
on_exit 'netns_pair_down'
netns_pair ip2
fail() { fail_with_dlrun_lines inprocess_2node "$*" "$work"/*.log; }
steps=14
train=("$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 --local-batch-size 1
  --max-steps "$steps" --checkpoint-every 5)

digests() {
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["param_digests"])' "$1"
}

agent() {  # agent NS ADDR JOB LOG [TRAIN_UNET FLAGS...]
  local ns=$1 addr=$2 job=$3 log=$4
  shift 4
  ip netns exec "$ns" env OMP_NUM_THREADS=1 DLRUN_RDZV_TOKEN="inprocess-$$" \
    timeout 300 "$DLRUN" --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
    --rdzv-endpoint "$addr_a:29400" --rdzv-id "$job" --local-addr "$addr" --max-restarts 2 \
    --report-json "$work/$job.$ns.report.json" -- \
    "${train[@]}" --checkpoint-dir "$work/$job.ckpt" --metrics-json "$work/$job.json" "$@" \
    >"$log" 2>&1
}
# check JOB LOST_RANK: what both agents said, and the digests.
check() {
  local job=$1 lost=$2 a="$work/$1.a.log" b="$work/$1.b.log" f
  for f in "$a" "$b"; do
    grep -q "in-process recovery: .*(generation 1, master port" "$f" ||
      fail "$job: $(basename "$f"): no in-process recovery line"
    grep -q "in-process recovery done: every rank holds the state" "$f" ||
      fail "$job: $(basename "$f"): the recovery did not end"
    ! grep -q -E "restart 1: node|resumed from step|new round" "$f" ||
      fail "$job: $(basename "$f"): a restart, a round or a checkpoint read"
  done
  grep -h "in-process recovery: " "$a" "$b" | grep -q "rank $lost (local rank" ||
    fail "$job: no line names rank $lost"
  grep -q "rank $lost took the state of step" "$a" "$b" ||
    fail "$job: rank $lost's replacement did not take the state from a peer"
  n=$(cat "$a" "$b" | grep -c "a peer was lost .*joining generation 1" || true)
  ((n == 3)) || fail "$job: $n survivor(s) joined generation 1, expected 3"
  [[ "$(digests "$work/$job.json")" == "$ref" ]] ||
    fail "$job: digests $(digests "$work/$job.json") differ from the fault-free run's $ref"
}
# The survivors' pids in the agents' first rank table (first_pids) are those that ran to the
# end: the job's only table (no round opened), and none of them died.

# both JOB [TRAIN_UNET FLAGS...]: the job's two agents; A first, as the rendezvous' host.
both() {
  local job=$1
  shift
  agent "$ns_a" "$addr_a" "$job" "$work/$job.a.log" "$@" & pa=$!
  follow_until "$work/$job.a.log" "hosting the rendezvous on $addr_a:29400" 60 ||
    fail "$job: A did not host"
  agent "$ns_b" "$addr_b" "$job" "$work/$job.b.log" "$@" & pb=$!
}

# The reference: the same two nodes, no fault (the shared-memory reduction among a node's ranks
# sums in another order than one node of 4 does).
both clean
wait "$pa" || fail "clean: A exited with $?"
wait "$pb" || fail "clean: B exited with $?"
ref=$(digests "$work/clean.json")

# 1. Rank 3 (node B) kills itself at the start of step 6.
both kill3 --fail-at-step 6 --fail-how kill
wait "$pa" || fail "kill3: A exited with $?"
wait "$pb" || fail "kill3: B exited with $?"
check kill3 3
echo "kill3: $(grep -h 'in-process recovery done' "$work"/kill3.*.log |
  sed 's/.*(generation/(generation/' | tr '\n' ' ')"

# 2. Rank 0 (node A) killed from outside during step 6.
both kill0
follow_until "$work/kill0.a.log" "step 5/$steps" 180 || fail "kill0: no step 5"
victim=$(first_pids "$work/kill0.a.log" | head -n 1)
[[ -n "$victim" ]] || fail "kill0: no rank table on A"
kill -KILL "$victim"
wait "$pa" || fail "kill0: A exited with $?"
wait "$pb" || fail "kill0: B exited with $?"
check kill0 0
for p in $(first_pids "$work/kill0.a.log" | tail -n +2) $(first_pids "$work/kill0.b.log"); do
  if grep -q "(local rank [0-9]*, pid $p)" "$work/kill0.a.log" "$work/kill0.b.log"; then
    fail "kill0: survivor $p was named lost"
  fi
done
echo "PASS (inprocess_2node): rank 3 (node B) and rank 0 (node A) each lost and replaced in" \
  "process across two nodes; no round, no checkpoint read; digests equal the fault-free run's"
rm -rf "$work"
