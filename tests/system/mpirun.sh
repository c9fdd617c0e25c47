#!/usr/bin/env bash
# mpirun -np 2 dlrun (Open MPI): each dlrun takes its node rank and the node count from
# OMPI_COMM_WORLD_*; the workers get ranks 0..3 once each.
source "$(dirname "$0")/lib.sh"

port=$(free_port)
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT="$port" \
  "$DLRUN" --nproc-per-node 2 \
  /bin/sh -c 'echo "worker RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_PORT=$MASTER_PORT"' \
  >mpirun.out 2>&1 || fail "mpirun failed"
out=mpirun.out
ranks=$(sed -n 's/.*worker RANK=\([0-9]*\) .*/\1/p' "$out" | sort -n | tr '\n' ' ')
[[ "$ranks" == "0 1 2 3 " ]] || fail "ranks '$ranks', expected 0 1 2 3 once each"
[[ $(count "WORLD_SIZE=4 " "$out") == 4 ]] || fail "world size"
[[ $(count "GROUP_RANK=0 " "$out") == 2 && $(count "GROUP_RANK=1 " "$out") == 2 ]] || fail "node ranks"
[[ $(count "MASTER_PORT=$port" "$out") == 4 ]] || fail "MASTER_PORT from mpirun -x"
# A real Gloo job across the two mpirun-started agents: ranks agree on the parameters.
timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT="$(free_port)" \
  -x OMP_NUM_THREADS=1 "$DLRUN" --nproc-per-node 2 "$TRAIN_UNET" --synthetic --base-channels 4 \
  --data-size 64 --max-steps 3 --metrics-json "$work/m.json" >train.out 2>&1 \
  || fail "training under mpirun failed: $(tail -n 20 train.out)"
grep -q '"world_size": 4' m.json || fail "training world size"
pass "mpirun: ranks $ranks, a 4-rank training"
