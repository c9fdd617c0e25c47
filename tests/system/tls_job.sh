#!/usr/bin/env bash
# dlrun slurm --tls: the job script makes a CA and a certificate for the job (the CA key deleted
# at once, files readable only by the user), the two agents meet over mutual TLS, and the files
# are gone when the job ends.
source "$(dirname "$0")/lib.sh"

"$DLRUN" slurm --nodes 2 --nproc-per-node 1 --time 5 --rdzv-port "$(free_port)" \
  --tls --tls-dir "$work/tls" -o job.sbatch \
  -- /bin/sh -c 'd=$(dirname "$DLRUN_RDZV_TLS_KEY"); echo "worker RANK=$RANK files=$(ls "$d" | tr "\n" " ")key=$(stat -c %a "$DLRUN_RDZV_TLS_KEY") dir=$(stat -c %a "$d")"' \
  2>gen.err || fail "dlrun slurm --tls failed: $(cat gen.err)"
submit job.sbatch 120
finish
grep -q "hosting the rendezvous on .* (mutual TLS)" "$out" || fail "the rendezvous was not served over mutual TLS"
for r in 0 1; do
  grep -q "worker RANK=$r files=ca.pem node.key node.pem key=600 dir=700" "$out" \
    || fail "rank $r: expected ca.pem node.key node.pem (no CA key), key 600, directory 700"
done
[[ -d tls && -z "$(ls -A tls)" ]] || fail "the job's TLS files were left: $(ls -R tls)"
pass "job $jid: mutual TLS with the job's own CA, files removed"
