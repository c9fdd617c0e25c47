#!/usr/bin/env bash
# A launch by PMIx alone, as under prterun or flux: srun --mpi=pmix with Slurm's own variables
# removed from dlrun's environment. dlrun must ask Slurm's PMIx server (PMIx_Init/PMIx_Get
# through libpmix.so.2) for the layout: 2 nodes, the run id from the namespace, the agents in
# PMIx rank order, the rendezvous on rank 0's host. Then the agents train 2 workers each.
source "$(dirname "$0")/lib.sh"

scrub=(env -u SLURM_JOB_ID -u SLURM_PROCID)
timeout 120 srun -N 2 --ntasks-per-node=1 --mpi=pmix --time=2 -o "$work/env.%t.out" \
  "${scrub[@]}" "$DLRUN" env || fail "srun ... dlrun env failed"
for t in 0 1; do
  f=env.$t.out
  grep -q "^detected   pmix$" "$f" || fail "task $t: source is not pmix: $(head -n 1 "$f")"
  grep -Eq "^PMIx rank +$t$" "$f" || fail "task $t: PMIx rank is not $t"
  grep -Eq "^PMIx PMIX_NODE_LIST +node1,node2$" "$f" || fail "task $t: node list"
  grep -Eq "^  nnodes +2:2$" "$f" || fail "task $t: nnodes is not 2:2"
  grep -Eq "^  rendezvous +grpc at node1:29400$" "$f" || fail "task $t: endpoint is not node1:29400"
  grep -Eq "^  run id +slurm\.pmix\.[0-9]+\.[0-9]+$" "$f" || fail "task $t: run id is not the namespace"
done

# The test nodes' names do not resolve, so the endpoint is given; nodes, order and run id
# still come from PMIx.
port=$(free_port)
timeout 120 srun -N 2 --ntasks-per-node=1 --mpi=pmix --time=2 -o "$work/train.out" \
  "${scrub[@]}" "$DLRUN" --nproc-per-node 2 --rdzv-endpoint "127.0.0.1:$port" \
  /bin/sh -c 'echo "worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK run=$TORCHELASTIC_RUN_ID node=$SLURMD_NODENAME"' \
  || fail "srun ... dlrun failed"
out=train.out
ranks=$(sed -n 's/.*worker RANK=\([0-9]*\) .*/\1/p' "$out" | sort -n | tr '\n' ' ')
[[ "$ranks" == "0 1 2 3 " ]] || fail "ranks '$ranks', expected 0 1 2 3 once each"
[[ $(count "WORLD_SIZE=4 GROUP_RANK=0 run=slurm\.pmix\.[0-9.]+ node=node1$" "$out") == 2 ]] \
  || fail "PMIx rank 0 (node1) is not group 0 of run slurm.pmix.*"
[[ $(count "WORLD_SIZE=4 GROUP_RANK=1 run=slurm\.pmix\.[0-9.]+ node=node2$" "$out") == 2 ]] \
  || fail "PMIx rank 1 (node2) is not group 1"
pass "PMIx only: 2 nodes from PMIx_Get, ranks $ranks"
