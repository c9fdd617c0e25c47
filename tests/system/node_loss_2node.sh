#!/usr/bin/env bash
# A node lost whole, and the node that comes back (docs/RECOVERY.md, "A node lost", "A node that
# joins"): two agents in two network namespaces, --nnodes 1:2, train_unet on 2 ranks each. Every
# process of node B is SIGKILLed in the middle of a step (its agent, workers and spares: the
# machine gone). Node A's ranks keep their processes and go on at world size 2 in the same round.
# Then node B's agent is started again: it is admitted into the running round, its two ranks take
# the state from a peer, and the job ends at world size 4. No checkpoint read and no new round
# anywhere, every step done, the four ranks' final parameters equal. Not a Slurm test: it only
# needs root and iproute2.
set -euo pipefail
: "${DLRUN:?}" "${TRAIN_UNET:?}"
source "$(dirname "$0")/common.sh"  # follow_until, netns_pair, fail_with_dlrun_lines, first_pids
work=$(mktemp -d /var/tmp/dlrun-nodeloss.XXXXXX)
on_exit 'netns_pair_down'
netns_pair nl2
fail() { fail_with_dlrun_lines node_loss_2node "$*" "$work"/*.log; }
steps=36
agent() {  # agent NS ADDR LOG
  ip netns exec "$1" env OMP_NUM_THREADS=1 DLRUN_RDZV_TOKEN="nodeloss-$$" \
    timeout 300 "$DLRUN" --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d \
    --rdzv-endpoint "$addr_a:29400" --rdzv-id nodeloss --local-addr "$2" --max-restarts 2 -- \
    "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 --local-batch-size 1 \
    --max-steps "$steps" --checkpoint-every 5 --checkpoint-dir "$work/ckpt.$1" \
    --metrics-json "$work/metrics.json" >"$3" 2>&1
}
a="$work/a.log" b="$work/b.log" b2="$work/b2.log"
agent "$ns_a" "$addr_a" "$a" & pa=$!
follow_until "$a" "hosting the rendezvous on $addr_a:29400" 60 || fail "A did not host"
agent "$ns_b" "$addr_b" "$b" & pb=$!
follow_until "$a" "step 5/$steps" 180 || fail "no step 5"
for p in $(ip netns pids "$ns_b"); do kill -KILL "$p" 2>/dev/null || true; done
wait "$pb" || true
follow_until "$a" "recovered in process at step [0-9]+ .* on 2 rank" 60 ||
  fail "A's ranks did not go on without B"
agent "$ns_b" "$addr_b" "$b2" & pb=$!  # node B comes back
wait "$pa" || fail "A exited with $?"
wait "$pb" || fail "B (back) exited with $?"

grep -q "lost 1 node(s): .*its connection closed" "$a" ||
  fail "A did not say node B was lost when its connection closed"
grep -q "the job goes on with 2 rank(s) on 1 node(s)" "$a" || fail "A's job did not go on without B"
grep -q "in-process recovery done: every rank holds the state" "$a" || fail "the recovery did not end"
grep -q "recovered in process at step [0-9]* .* on 2 rank(s)" "$a" || fail "rank 0 did not go on"
! grep -q -E "restart 1: node|resumed from step|new round" "$a" ||
  fail "a restart, a round or a checkpoint read on A"
grep -q "step $steps/$steps" "$a" || fail "A did not finish its steps"
grep -q "node .* joined the running round; the job goes on with 4 rank(s) on 2 node(s)" "$a" ||
  fail "A did not hear of B's admission"
grep -q "admitted into the running group at generation 2" "$b2" || fail "B was not admitted"
grep -q "rank [01]: a node joined: the group grows to 4 ranks" "$a" ||
  fail "A's ranks did not say the group grows"
# The ledger: the loss's recovery, and the admission as a span of its own, unless it came before
# a step past the loss's (then it extends the loss's span: one outage).
spans=$(grep -c -E "^  (in-process recovery|a node admitted) after step [0-9]+: " "$a" || true)
grep -q "^  in-process recovery after step [0-9]*: " "$a" || fail "A's report has no recovery"
if ((spans == 2)); then
  grep -q "^  a node admitted after step [0-9]*: " "$a" || fail "A's report does not name the admission"
else
  ((spans == 1)) || fail "A's report has $spans in-process spans (expected 1 or 2)"
fi
grep -q "rank [23] took the state of step [0-9]* from rank" "$b2" ||
  fail "B's ranks did not take the state from a peer"
grep -q "recovered in process at step [0-9]* .* on 4 rank(s)" "$a" || fail "A did not grow to 4"
! grep -q -E "restart 1: node|resumed from step|new round" "$b2" ||
  fail "a restart, a round or a checkpoint read on B"
# Both of A's first workers ran to the end: none named lost.
for p in $(first_pids "$a"); do
  ! grep -q "(local rank [0-9]*, pid $p)" "$a" || fail "survivor $p was named lost"
done
digests=$(/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["param_digests"]
print(len(d), len(set(d)))' "$work/metrics.json")
[[ "$digests" == "4 1" ]] || fail "final digests: $digests (ranks, distinct), expected 4 ranks, 1 digest"
echo "PASS (node_loss_2node): node B lost whole; node A's 2 ranks went on in process at world" \
  "size 2 in the same round; node B back, admitted into it, its ranks took the state from a" \
  "peer; no checkpoint read, no new round, 4 digests equal"
rm -rf "$work"
