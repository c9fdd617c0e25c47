#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for the system tests (ctest label `slurm`).
#
#   tests/system/cluster.sh start DIR   writes DIR/slurm.conf, starts munged, slurmctld and two
#                                      slurmd (node1, node2), waits until a 2-node step runs
#   DLRUN_TEST_NODE_PREFIX=bnode ...   names the nodes bnode1, bnode2: a second cluster on the
#                                      same machine (ctest runs two) whose nodes' cpuset cgroups
#                                      (slurm_<node>) are its own
#   tests/system/cluster.sh stop DIR    stops every daemon it started, by the pids it recorded
#   tests/system/cluster.sh env DIR     prints the exports a shell needs to use the cluster
#
# All state (config, munge key and socket, spool, logs, pid files) lives under DIR; ports are
# picked free at start. Both slurmd run as separate "nodes" on 127.0.0.1 with distinct ports,
# each in a private mount namespace with its own /tmp (srun --mpi=pmix creates the same
# /tmp/spmix_appdir_* path on every node). So DIR, and job files, must not be under /tmp.
set -euo pipefail

cmd=${1:?usage: cluster.sh start|stop|env DIR}
dir=${2:?usage: cluster.sh start|stop|env DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
np=${DLRUN_TEST_NODE_PREFIX:-node}
[[ "$np" =~ ^[a-z]+$ ]] || { echo "cluster.sh: DLRUN_TEST_NODE_PREFIX='$np' is invalid: expected lowercase letters" >&2; exit 2; }

print_env() {
  echo "export SLURM_CONF=$dir/slurm.conf"
}

stop_all() {
  local pid name ns p
  # Jobs first (a failed test may leave one running), then every process left in a node's
  # private mount namespace (slurmstepd and job tasks, which are not the daemons' children).
  if [[ -e "$dir/pids/slurmctld.pid" ]] && kill -0 "$(cat "$dir/pids/slurmctld.pid")" 2>/dev/null; then
    SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
  fi
  for f in "$dir"/pids/*.mntns; do
    [[ -e "$f" ]] || continue
    ns=$(cat "$f")
    for p in /proc/[0-9]*; do
      [[ "$(readlink "$p/ns/mnt" 2>/dev/null)" == "$ns" ]] || continue
      pid=${p#/proc/}
      [[ "$pid" == "$(cat "${f%.mntns}.pid" 2>/dev/null)" ]] && continue  # slurmd itself: below
      name=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | cut -c1-60)
      kill -KILL "$pid" 2>/dev/null && echo "cluster: killed leftover $name ($pid)"
    done
    rm -f "$f"
  done
  for f in "$dir"/pids/*.pid; do
    [[ -e "$f" ]] || continue
    pid=$(cat "$f")
    name=$(basename "$f" .pid)
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      # Wait for it to exit (bounded), then make sure.
      timeout 10 tail --pid="$pid" -f /dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
      echo "cluster: stopped $name ($pid)"
    fi
    rm -f "$f"
  done
  # The nodes' cpuset cgroups (task/cgroup): Slurm removes each job's, the nodes' own stay.
  # rmdir fails, harmlessly, while another test cluster on this machine uses them.
  if [[ -e "$dir/cgroup.conf" ]]; then
    rmdir /sys/fs/cgroup/cpuset/slurm_"$np"{1,2}/uid_*/ /sys/fs/cgroup/cpuset/slurm_"$np"{1,2}/ \
      2>/dev/null || true
  fi
}

case "$cmd" in
  env) print_env; exit 0 ;;
  stop) stop_all; exit 0 ;;
  start) ;;
  *) echo "cluster.sh: unknown command '$cmd' (expected start, stop or env)" >&2; exit 2 ;;
esac

for bin in munged slurmctld slurmd sbatch srun; do
  command -v "$bin" >/dev/null || {
    echo "cluster.sh: '$bin' not found: run scripts/install-deps --system" >&2
    exit 2
  }
done

stop_all
case "$dir/" in
  /tmp/*)
    echo "cluster.sh: DIR '$dir' is under /tmp, which each node replaces with its own: use a" \
      "build directory outside /tmp (clone the repository elsewhere)" >&2
    exit 2 ;;
esac
rm -rf "$dir/state" "$dir/spool" "$dir/log" "$dir/munge" "$dir/tmp"
mkdir -p "$dir/state" "$dir/spool/${np}1" "$dir/spool/${np}2" "$dir/log" "$dir/munge" \
  "$dir/pids" "$dir/tmp/${np}1" "$dir/tmp/${np}2"
chmod 700 "$dir/munge"

# munge: our own key, socket and daemon (the system's munged, if any, is left alone).
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munged.seed"
cp "$dir/munge/munged.pid" "$dir/pids/munged.pid"

ctld_port=$(free_port)
port1=$(free_port)
port2=$(free_port)
while [[ $port2 == "$port1" ]]; do port2=$(free_port); done
host=$(hostname -s)
ncpus=$(nproc)
# Each node advertises this machine's CPUs (both "nodes" share them), at least 2 so that a job
# can run 2 workers per node. Tasks are bound to the CPUs they were given (task/affinity), as on
# a production cluster: an srun that asks for too few CPUs puts a node's workers on one core.
# Where this machine lets us make cpuset cgroups (v1), task/cgroup confines them too.
node_cpus=$((ncpus < 2 ? 2 : ncpus))
task_plugin=task/affinity
if [[ -z "${DLRUN_TEST_NO_CGROUP:-}" ]] && mkdir /sys/fs/cgroup/cpuset/dlrun-probe.$$ 2>/dev/null; then
  rmdir /sys/fs/cgroup/cpuset/dlrun-probe.$$
  task_plugin=task/cgroup,task/affinity
  printf '%s\n' CgroupPlugin=cgroup/v1 CgroupMountpoint=/sys/fs/cgroup ConstrainCores=yes \
    >"$dir/cgroup.conf"
else
  rm -f "$dir/cgroup.conf"
fi
cat >"$dir/slurm.conf" <<EOF
# Generated by tests/system/cluster.sh: a two-node test cluster on one machine.
ClusterName=dlrun-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/munge
# cred_expire: a requeued job may start again after this many seconds (default 120).
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/state/slurmctld.pid
SlurmdPidFile=$dir/spool/%n/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=$task_plugin
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
# Job ids from a random start: another test cluster on this machine (a second build tree)
# then names its jobs, and so their cgroups, differently.
FirstJobId=$((1000 + RANDOM * 16 + RANDOM % 16))
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=20
NodeName=${np}[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=$port1,$port2 CPUs=$node_cpus RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=${np}[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
# Slurm's own OCI containers (srun --container=BUNDLE; tests/system/container_job.sh): runc as
# root, each node's containers in a runc state directory of its own (%n: the node).
if command -v runc >/dev/null; then
  rr="runc --root=$dir/runc/%n"
  cat >"$dir/oci.conf" <<OCI
# Generated by tests/system/cluster.sh: srun --container runs the step in a runc container.
RunTimeQuery="$rr state %n.%u.%j.%s.%t"
RunTimeRun="$rr run %n.%u.%j.%s.%t -b %b"
RunTimeKill="$rr kill -a %n.%u.%j.%s.%t"
RunTimeDelete="$rr delete --force %n.%u.%j.%s.%t"
OCI
  mkdir -p "$dir/runc"
else
  rm -f "$dir/oci.conf"
fi
# Slurm reads the ports of node[1-2] from a comma list in the same order.
echo "cluster: $dir/slurm.conf (slurmctld port $ctld_port, ${np}1 $port1, ${np}2 $port2, host $host, $ncpus cores)"

export SLURM_CONF="$dir/slurm.conf"
# The daemons start in the cluster's directory: a core dump of one of them (slurmstepd once
# crashed in stepd_cleanup, and its core was written in the caller's directory, the checkout)
# stays there.
(cd "$dir" && exec slurmctld -D -i -f "$SLURM_CONF") >"$dir/log/slurmctld.out" 2>&1 &
echo $! >"$dir/pids/slurmctld.pid"
for n in "${np}1" "${np}2"; do
  # A private mount namespace whose /tmp is this node's own directory.
  (cd "$dir" && exec unshare -m --propagation private sh -c \
    "mount --bind '$dir/tmp/$n' /tmp && exec slurmd -D -N $n -f '$SLURM_CONF'") \
    >"$dir/log/slurmd.$n.out" 2>&1 &
  echo $! >"$dir/pids/slurmd-$n.pid"
done

# Ready when a two-node step runs; srun itself waits for the nodes to register.
if ! timeout 90 srun -N 2 -n 2 --time=1 hostname >"$dir/log/ready.out" 2>&1; then
  echo "cluster.sh: the cluster did not run a 2-node step within 90 s; logs:" >&2
  tail -n 20 "$dir"/log/*.log "$dir"/log/*.out >&2 || true
  stop_all
  exit 1
fi
# Each node's mount namespace, to find what its jobs leave behind at stop.
for n in "${np}1" "${np}2"; do
  readlink "/proc/$(cat "$dir/pids/slurmd-$n.pid")/ns/mnt" >"$dir/pids/slurmd-$n.mntns"
done
sinfo -N -o "%N %T %c" | sed 's/^/cluster: /'
