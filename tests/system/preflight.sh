#!/usr/bin/env bash
# The preflight finds a slow node before step 0: two agents in two network namespaces (a veth
# pair), node B with its own host name and its CPU throttled by a cgroup to a twentieth of a core,
# node A in a sibling cgroup without a limit. Both at the same level: the kernel shares the CPU
# between sibling cgroups by weight, so with A left in the test's cgroup (beside two CPU-bound
# loops and a build), B's own cgroup got more of the machine than A's whole one, its quarter of a
# core measured 72-93% of A, and B was not left out. As siblings, A gets at least its equal share
# and B at most its quota, however busy the rest of the machine is.
#   elastic (--nnodes 1:2): B is named and left out in under 10 s, and A trains alone;
#   not elastic (--nnodes 2): the job fails at once on both nodes, naming B.
# B goes into the user's bad-node list (HOME is the test's), the next `dlrun slurm` excludes
# it, and `dlrun bad-nodes --clear` forgets it. Not a Slurm test: it needs root, iproute2 and a
# cgroup cpu controller (v1 or v2).
set -euo pipefail
: "${DLRUN:?}" "${TRAIN_UNET:?}"
source "$(dirname "$0")/common.sh"  # netns_pair, fail_with_dlrun_lines
work=$(mktemp -d /var/tmp/dlrun-preflight.XXXXXX)
id=$$
slow_host="dlrun-slow-$id"
export HOME="$work/home"
unset XDG_CACHE_HOME
if [[ -e /sys/fs/cgroup/cgroup.controllers ]]; then  # cgroup v2
  cg="/sys/fs/cgroup/dlrun-slow-$id" cg_a="/sys/fs/cgroup/dlrun-fast-$id"
  echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  mkdir "$cg" "$cg_a"
  echo "5000 100000" >"$cg/cpu.max"
else
  cg="/sys/fs/cgroup/cpu/dlrun-slow-$id" cg_a="/sys/fs/cgroup/cpu/dlrun-fast-$id"
  mkdir "$cg" "$cg_a"
  echo 100000 >"$cg/cpu.cfs_period_us"
  echo 5000 >"$cg/cpu.cfs_quota_us"
fi
cleanup() {
  netns_pair_down
  rmdir "$cg" "$cg_a" 2>/dev/null || true
}
on_exit 'cleanup'
fail() { fail_with_dlrun_lines preflight "$*" "$work"/*.log; }
netns_pair pf

port=29400
agent() {  # agent NS ADDR LOG NNODES [slow]: one agent in its cgroup (joined before `ip netns
  # exec`, which mounts a sysfs of the namespace's); B's is the throttled one, with its own host
  # name
  local outer=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg_a") inner=()
  if [[ ${5:-} == slow ]]; then
    outer=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg")
    inner=(unshare --uts sh -c 'hostname "$0" && exec "$@"' "$slow_host")
  fi
  "${outer[@]}" ip netns exec "$1" "${inner[@]}" env OMP_NUM_THREADS=1 DLRUN_RDZV_TOKEN="preflight-$id" \
    timeout 120 "$DLRUN" --nnodes "$4" --nproc-per-node 2 --rdzv-backend c10d \
    --rdzv-endpoint "$addr_a:$port" --rdzv-id "pre$id$4" --local-addr "$2" --preflight quick \
    --rdzv-conf "last_call_timeout=5" -- \
    "$TRAIN_UNET" --synthetic --base-channels 4 --data-size 64 --local-batch-size 1 \
    --max-steps 3 >"$3" 2>&1
}

# Elastic: B is left out, A trains alone.
start=$SECONDS
agent "$ns_a" "$addr_a" "$work/a1.log" 1:2 & pa=$!
agent "$ns_b" "$addr_b" "$work/b1.log" 1:2 slow & pb=$!
rcb=0; wait "$pb" || rcb=$?
took=$((SECONDS - start))
((rcb == 1)) || fail "elastic: B exited with $rcb, expected 1"
grep -q "left out by the preflight: node $slow_host: compute probe .* GFLOP/s, under 50% of the round's median" \
  "$work/b1.log" || fail "elastic: B's log does not say why it was left out"
((took < 10)) || fail "elastic: B was left out after $took s (expected under 10 s)"
rca=0; wait "$pa" || rca=$?
((rca == 0)) || fail "elastic: A exited with $rca"
grep -q "preflight (quick): .*compute .* GFLOP/s on one core" "$work/a1.log" ||
  fail "elastic: A's log has no preflight line"
grep -qE "node 0 of 1" "$work/a1.log" || fail "elastic: A did not train as the only node"

# Not elastic: the round needs B, so the job fails at once on both nodes.
start=$SECONDS
agent "$ns_a" "$addr_a" "$work/a2.log" 2 & pa=$!
agent "$ns_b" "$addr_b" "$work/b2.log" 2 slow & pb=$!
rca=0; wait "$pa" || rca=$?
rcb=0; wait "$pb" || rcb=$?
took=$((SECONDS - start))
((rca == 1 && rcb == 1)) || fail "not elastic: A exited with $rca and B with $rcb, expected 1 and 1"
grep -q "the preflight found a slow node the round cannot do without (--nnodes needs at least 2): node $slow_host" \
  "$work/a2.log" || fail "not elastic: A's log does not name B"
((took < 10)) || fail "not elastic: the job failed after $took s (expected under 10 s)"

# Remembered: the list has B (not A), `dlrun slurm` excludes it, --clear forgets it.
list=$("$DLRUN" bad-nodes)
grep -q "^$slow_host  since .* left out by the preflight" <<<"$list" || fail "dlrun bad-nodes: '$list'"
grep -q "^$(hostname) " <<<"$list" && fail "dlrun bad-nodes lists the healthy node: '$list'"
"$DLRUN" slurm --nodes 2 -o "$work/job.sbatch" -- train.py 2>"$work/slurm.err" ||
  fail "dlrun slurm failed: $(cat "$work/slurm.err")"
grep -q "^#SBATCH --exclude=$slow_host " "$work/job.sbatch" || fail "no --exclude for $slow_host"
grep -q "excluding $slow_host, found bad before" "$work/slurm.err" || fail "dlrun slurm said nothing"
"$DLRUN" bad-nodes --clear "$slow_host" | grep -q "cleared 1 node" || fail "--clear"
"$DLRUN" slurm --nodes 2 -- train.py 2>/dev/null | grep -q -- "--exclude" && fail "still excluded"
echo "PASS (preflight): the throttled node was left out (elastic) or failed the job (not), in under 10 s; dlrun slurm excluded it until cleared"
rm -rf "$work"
