#!/usr/bin/env bash
# srun --mpi=pmix starts one dlrun per node (PMIx and Slurm variables set); the agents meet at
# the rendezvous and give the workers ranks 0..3 once each.
source "$(dirname "$0")/lib.sh"

port=$(free_port)
timeout 120 srun -N 2 --ntasks-per-node=1 --mpi=pmix --time=2 -o "$work/srun.out" \
  "$DLRUN" --nproc-per-node 2 --rdzv-endpoint "127.0.0.1:$port" \
  /bin/sh -c 'echo "worker RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK agent_pmix_rank=$PMIX_RANK node=$SLURMD_NODENAME"' \
  || fail "srun failed"
out=srun.out
ranks=$(sed -n 's/.*worker RANK=\([0-9]*\) .*/\1/p' "$out" | sort -n | tr '\n' ' ')
[[ "$ranks" == "0 1 2 3 " ]] || fail "ranks '$ranks', expected 0 1 2 3 once each"
[[ $(count "WORLD_SIZE=4 " "$out") == 4 ]] || fail "world size"
# The agents were started by PMIx (the workers inherit the agent's PMIX_RANK 0 or 1) on two nodes.
[[ $(count "agent_pmix_rank=0 node=node1" "$out") == 2 ]] || fail "agent with PMIX_RANK 0 on node1"
[[ $(count "agent_pmix_rank=1 node=node2" "$out") == 2 ]] || fail "agent with PMIX_RANK 1 on node2"
pass "srun --mpi=pmix: ranks $ranks"
