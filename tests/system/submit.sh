#!/usr/bin/env bash
# dlrun slurm --submit writes the script, submits it with sbatch and prints the job id; the
# job runs one worker on each of the two nodes.
source "$(dirname "$0")/lib.sh"

"$DLRUN" slurm --nodes 2 --nproc-per-node 1 --time 5 --job-name subtest \
  --rdzv-port "$(free_port)" --submit \
  -- /bin/sh -c 'echo "worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE on $SLURMD_NODENAME"' \
  >jid.out 2>submit.err || fail "dlrun slurm --submit failed: $(cat submit.err)"
jid=$(cat jid.out)
[[ "$jid" =~ ^[0-9]+$ ]] || fail "expected a job id on stdout, got '$jid'"
[[ -x dlrun-subtest.sbatch ]] || fail "the script was not written as dlrun-subtest.sbatch"
grep -q "submitted dlrun-subtest.sbatch as job $jid" submit.err || fail "no submission message"
# srun with a dependency blocks until the job has ended (and fails if it did not succeed).
timeout 120 srun -N 1 -n 1 --time=1 --dependency="afterok:$jid" true \
  || fail "job $jid did not succeed"
out="dlrun-$jid.out"
grep -q "worker RANK=0 WORLD_SIZE=2 on node1" "$out" || fail "rank 0 on node1"
grep -q "worker RANK=1 WORLD_SIZE=2 on node2" "$out" || fail "rank 1 on node2"
pass "submitted job $jid, ranks 0 and 1 on node1 and node2"
