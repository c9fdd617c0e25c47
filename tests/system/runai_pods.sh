#!/usr/bin/env bash
# Two simulated Run:ai pods: two network namespaces with their own addresses (a veth pair),
# each running the exact command `dlrun runai` prints, with the environment the Kubeflow
# operator and Run:ai inject (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, POD_INDEX, JOB_UUID,
# ...). The master pod hosts the rendezvous; the training must finish with 4 ranks.
# (Not a Run:ai cluster: that cannot run here. This checks dlrun's side of the contract.)
source "$(dirname "$0")/lib.sh"

command -v ip >/dev/null || fail "ip (iproute2) is missing: scripts/install-deps --system"
id=$$
ns0="dlrun-pod0-$id"
ns1="dlrun-pod1-$id"
net="10.$((RANDOM % 200 + 20)).$((RANDOM % 250)).0"
addr0="${net%.0}.1"
addr1="${net%.0}.2"
cleanup() {
  for ns in "$ns0" "$ns1"; do
    # Nothing of the job may outlive the pods.
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
on_exit 'cleanup'
ip netns add "$ns0"
ip netns add "$ns1"
ip link add "veth0-$id" netns "$ns0" type veth peer name "veth1-$id" netns "$ns1"
ip -n "$ns0" addr add "$addr0/24" dev "veth0-$id"
ip -n "$ns1" addr add "$addr1/24" dev "veth1-$id"
for ns in "$ns0" "$ns1"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns0" link set "veth0-$id" up
ip -n "$ns1" link set "veth1-$id" up

# What the user runs, and the manifest that goes with it.
"$DLRUN" runai --name unet-test -p team -i registry.local/dlrun:test --workers 1 \
  --nproc-per-node 2 --rdzv-port 29400 -e OMP_NUM_THREADS=1 -o manifest.yaml \
  -- "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 --local-batch-size 1 \
  --max-steps 4 --metrics-json "$work/m.json" >runai.cmd 2>/dev/null
eval "set -- $(cat runai.cmd)"
[[ "$1 $2 $3 $4" == "runai training pytorch submit" ]] || fail "not a runai command: $*"
# The pods run what follows `--command --`, with the -e variables.
pod_env=()
while (($#)) && [[ "$1" != "--command" ]]; do
  [[ "$1" == "-e" ]] && pod_env+=("$2")
  shift
done
shift 2
pod_cmd=("$@")
[[ "${pod_cmd[0]}" == dlrun ]] || fail "pod command starts with '${pod_cmd[0]}'"
pod_cmd[0]="$DLRUN"  # the image's dlrun is the one we built
grep -q "containerPort: 29400" manifest.yaml || fail "manifest: rendezvous port"

token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')  # the manifest's Secret
uuid="$(cat /proc/sys/kernel/random/uuid)"
run_pod() {  # run_pod NS INDEX
  ip netns exec "$1" env -i PATH="$PATH" HOME="$work" TMPDIR="$work" "${pod_env[@]}" \
    MASTER_ADDR="$addr0" MASTER_PORT=23456 WORLD_SIZE=2 RANK="$2" POD_INDEX="$2" \
    PET_NPROC_PER_NODE=2 JOB_NAME=unet-test JOB_UUID="$uuid" POD_UUID="pod-$2-$uuid" \
    DLRUN_RDZV_TOKEN="$token" NODE_NAME="node-$2" \
    timeout 300 "${pod_cmd[@]}" >"pod$2.out" 2>&1
}
# The worker pod may start first: it waits for the master pod's rendezvous.
run_pod "$ns1" 1 & pid1=$!
run_pod "$ns0" 0 & pid0=$!
rc0=0; rc1=0
wait "$pid0" || rc0=$?
wait "$pid1" || rc1=$?
((rc0 == 0)) || fail "master pod exited with $rc0: $(tail -n 30 pod0.out)"
((rc1 == 0)) || fail "worker pod exited with $rc1: $(tail -n 30 pod1.out)"

grep -q "hosting the rendezvous on $addr0:29400" pod0.out || fail "the master pod did not host the rendezvous"
grep -q "hosting the rendezvous" pod1.out && fail "the worker pod hosted a rendezvous"
grep -q "node 0 of 2, world size 4, master $addr0:" pod0.out || fail "master pod is not node 0"
grep -q "node 1 of 2, world size 4, master $addr0:" pod1.out || fail "worker pod is not node 1"
[[ "$(cat pod0.out pod1.out > both.out; ranks_in_tables both.out)" == "0 1 2 3 " ]] || fail "ranks"
grep -q '"world_size": 4' m.json || fail "metrics: world size"
grep -q '"steps": 4' m.json || fail "metrics: steps"
pass "2 pods in separate network namespaces ($addr0, $addr1): 4 ranks trained"
