#!/usr/bin/env bash
# In-process recovery across nodes of one rank each (docs/RECOVERY.md, "Across nodes"): two agents
# in two network namespaces, --nnodes 2 --nproc-per-node 1, a Python DDP program
# (tests/python/recoverable_train.py) whose rank 1 (node B) SIGKILLs itself at the start of
# step 6. Node B has no survivor of its own: it asks the job, its rank starts again and takes the
# state from rank 0 on node A, which keeps its process; no round opens, no checkpoint is read,
# and both ranks end with the digests of the fault-free run. Once with each spelling of dlrun's
# rendezvous (--rdzv-backend c10d and grpc). Not a Slurm test: it needs root and iproute2.
set -euo pipefail
: "${DLRUN:?}" "${SOURCE_DIR:?}" "${TEST_PYTHON:?}"
source "$(dirname "$0")/common.sh"  # follow_until, netns_pair, fail_with_dlrun_lines
work=$(mktemp -d /var/tmp/dlrun-1rank.XXXXXX)
on_exit 'netns_pair_down'
netns_pair r1
fail() { fail_with_dlrun_lines inprocess_1rank_nodes "$*" "$work"/*.log; }
steps=12

agent() {  # agent NS ADDR LINK BACKEND JOB LOG [ENV...]
  local ns=$1 addr=$2 link=$3 backend=$4 job=$5 log=$6
  shift 6
  # Gloo's own interface: the namespace's link (its hostname resolves to loopback there).
  ip netns exec "$ns" env OMP_NUM_THREADS=1 DLRUN_RDZV_TOKEN="onerank-$$" GLOO_SOCKET_IFNAME="$link" \
    PYTHON_EXEC="$TEST_PYTHON" PYTHONPATH="$SOURCE_DIR/python" "$@" \
    timeout 300 "$DLRUN" --nnodes 2 --nproc-per-node 1 --rdzv-backend "$backend" \
    --rdzv-endpoint "$addr_a:29400" --rdzv-id "$job" --local-addr "$addr" \
    "$SOURCE_DIR/tests/python/recoverable_train.py" "$steps" >"$log" 2>&1
}
both() {  # both BACKEND JOB [ENV...]: A first, as the rendezvous' host
  local backend=$1 job=$2
  shift 2
  agent "$ns_a" "$addr_a" "$link_a" "$backend" "$job" "$work/$job.a.log" "$@" & pa=$!
  follow_until "$work/$job.a.log" "hosting the rendezvous on $addr_a:29400" 60 ||
    fail "$job: A did not host"
  agent "$ns_b" "$addr_b" "$link_b" "$backend" "$job" "$work/$job.b.log" "$@" & pb=$!
  wait "$pa" || fail "$job: A exited with $?"
  wait "$pb" || fail "$job: B exited with $?"
}
digests() { cat "$work/$1".?.log | grep -o 'rank [0-9] digest [-0-9]*' | sort; }

both c10d clean
ref=$(digests clean)
[[ $(echo "$ref" | wc -l) == 2 ]] || fail "clean: no digest of each rank: $ref"
for backend in c10d grpc; do
  job=kill-$backend
  both "$backend" "$job" KILL_RANK=1 KILL_STEP=6
  a="$work/$job.a.log" b="$work/$job.b.log"
  for f in "$a" "$b"; do
    grep -q "in-process recovery done: every rank holds the state" "$f" ||
      fail "$job: $(basename "$f"): the recovery did not end"
    ! grep -q -E "restart 1: node|resumed from step|new round|no rank survived" "$f" ||
      fail "$job: $(basename "$f"): a restart, a round or a checkpoint read"
  done
  grep -q "rank 1 took the state of step" "$b" || fail "$job: rank 1's replacement took no state"
  grep -q "rank 0: a peer was lost .*joining generation 1" "$a" ||
    fail "$job: rank 0 (node A) did not keep its process and join generation 1"
  [[ "$(digests "$job")" == "$ref" ]] ||
    fail "$job: digests $(digests "$job" | tr '\n' ' ') differ from the fault-free run's $ref"
  echo "$job: $(grep -h 'in-process recovery done' "$a" | sed 's/.*(generation/(generation/')"
done
echo "PASS (inprocess_1rank_nodes): rank 1, alone on node B, lost and replaced in process with" \
  "c10d and grpc; digests equal the fault-free run's"
rm -rf "$work"
