#!/usr/bin/env bash
# A 2-node job in Slurm's own OCI containers: the image (containers/Containerfile, built from
# the wheel without torch) as an OCI bundle (scripts/make-oci-bundle), the test cluster's
# oci.conf running runc (tests/system/cluster.sh), and the sbatch script `dlrun slurm
# --container BUNDLE` writes. One worker is SIGKILLed on the first attempt: the agents restart
# the workers inside the same containers (the same PID 1), and the job ends COMPLETED.
source "$(dirname "$0")/lib.sh"
[[ -e "$CLUSTER_DIR/oci.conf" ]] || fail "the test cluster has no oci.conf (runc missing: scripts/install-deps --system)"
source "$SOURCE_DIR/tests/package/podman.sh"
base=$(base_image)
podman_probe "$base"
tag=localhost/dlrun-slurm-test:$$
on_exit 'podman rmi -f "$tag" >/dev/null 2>&1 || true'
"$SOURCE_DIR/scripts/build-image" -t "$tag" --build-arg "BASE=$base" --build-arg TORCH= \
  "${PODMAN_FLAGS[@]}" >/dev/null 2>"$work/build-image.log" || { cat "$work/build-image.log"; fail "scripts/build-image"; }
# The job's directory at the same path inside the containers: the program and its records.
"$SOURCE_DIR/scripts/make-oci-bundle" "$tag" "$work/bundle" --mount "$work" >/dev/null ||
  fail "scripts/make-oci-bundle"
mkdir -p "$work/rec"
cp "$SOURCE_DIR/tests/system/container_prog.py" "$work/"
"$DLRUN" slurm --nodes 2 --nproc-per-node 2 --time 10 --rdzv-port "$(free_port)" \
  --container "$work/bundle" --max-restarts 2 -o job.sbatch -- "$work/container_prog.py" "$work/rec"
grep -q -- "--container=$work/bundle" job.sbatch || fail "no srun --container in the script"
grep -q "/opt/dlrun/bin/dlrun" job.sbatch || fail "the script does not run the image's dlrun"
submit job.sbatch 300
finish
state=$(scontrol show job "$jid" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
[[ "$state" == COMPLETED ]] || fail "job $jid ended $state, not COMPLETED"
grep -q "restart 1: node 0 of 2" "$out" || fail "node 0 did not restart its workers"
grep -q "restart 1: node 1 of 2" "$out" || fail "node 1 did not restart its workers"
for a in 0 1; do
  for r in 0 1 2 3; do
    [[ -f "rec/attempt$a-rank$r" ]] || fail "no record of rank $r in attempt $a"
    grep -q "python=/opt/dlrun/bin/python3 pid1=/opt/dlrun/bin/dlrun " "rec/attempt$a-rank$r" ||
      fail "rank $r, attempt $a did not run in the container under its dlrun: $(cat "rec/attempt$a-rank$r")"
    grep -q "slurm_job=$jid world=4" "rec/attempt$a-rank$r" || fail "rank $r, attempt $a: no Slurm job id or world size"
  done
done
# Two containers (one per node: a PID namespace each), and the restart happened in the same two,
# whose PID 1 (the agent) had not started again.
before=$(cat rec/attempt0-* | sed 's/.*container=\([^ ]*\).*/\1/' | sort -u | tr '\n' ' ')
after=$(cat rec/attempt1-* | sed 's/.*container=\([^ ]*\).*/\1/' | sort -u | tr '\n' ' ')
[[ $(wc -w <<<"$before") == 2 ]] || fail "expected 2 containers: $before"
[[ "$before" == "$after" ]] || fail "the restart ran in other containers: $before then $after"
pass "2 nodes in OCI containers (runc), a killed worker restarted in the same containers ($before), job COMPLETED"
