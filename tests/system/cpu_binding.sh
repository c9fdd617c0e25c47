#!/usr/bin/env bash
# The cluster binds tasks to their CPUs (task/affinity, and task/cgroup's cpuset where the
# machine allows it). A plain srun task gets one CPU; the agents of a `dlrun slurm
# --cpus-per-task N` job, and so their workers, get N: the script's srun passes --cpus-per-task
# on (srun no longer reads it from sbatch's SLURM_CPUS_PER_TASK since Slurm 22.05).
# The job runs with SLURM_EXACT=1 (srun --exact, as sites set it): a step then gets only the CPUs
# it asks for. Without it this Slurm (22.05) gives a step every CPU of the job on the node, and a
# script that forgot --cpus-per-task could not be told apart here.
source "$(dirname "$0")/lib.sh"

cpus=$(scontrol show node node1 | sed -n 's/.*CPUTot=\([0-9]*\).*/\1/p')
((cpus >= 2)) || fail "the test nodes have $cpus CPU(s); binding can only be told apart with 2 or more"
# count_cpus "Cpus_allowed_list:	0-1,3": how many CPUs the list names.
count_cpus() {
  local n=0 part lo hi
  IFS=, read -ra parts <<<"$(echo "$1" | awk '{print $2}')"
  for part in "${parts[@]}"; do
    lo=${part%-*} hi=${part#*-}
    n=$((n + hi - lo + 1))
  done
  echo "$n"
}

# The control: binding is on, so a one-CPU task sees one CPU.
plain=$(timeout 120 srun -N 1 -n 1 --time=1 grep Cpus_allowed_list /proc/self/status) \
  || fail "srun failed: $plain"
[[ $(count_cpus "$plain") == 1 ]] || fail "a plain srun task is not bound to 1 CPU: '$plain' (is TaskPlugin=task/affinity on?)"

"$DLRUN" slurm --nodes 2 --nproc-per-node 2 --cpus-per-task "$cpus" --time 5 \
  --rdzv-port "$(free_port)" -o job.sbatch \
  -- sh -c 'cg=$(sed -n "s/^[0-9]*:cpuset://p" /proc/$$/cgroup)
            echo "rank $RANK cpuset $(cat /sys/fs/cgroup/cpuset$cg/cpuset.cpus 2>/dev/null || echo -)"
            echo "rank $RANK pid $$ $(grep Cpus_allowed_list /proc/$$/status)"' 2>/dev/null
grep -q -- "--cpus-per-task=\"\${SLURM_CPUS_PER_TASK:-$cpus}\"" job.sbatch \
  || fail "the srun line does not pass --cpus-per-task"
SLURM_EXACT=1 submit job.sbatch 300
finish
for rank in 0 1 2 3; do
  line=$(grep -o "rank $rank pid [0-9]* Cpus_allowed_list:.*" "$out" | head -n 1)
  [[ -n "$line" ]] || fail "rank $rank printed no affinity"
  n=$(count_cpus "${line#*pid [0-9]* }")
  [[ $n == "$cpus" ]] || fail "rank $rank: '$line': $n CPU(s), expected the $cpus asked for"
  if [[ -e "$CLUSTER_DIR/cgroup.conf" ]]; then  # task/cgroup: the step's cpuset holds them too
    set_line=$(grep -o "rank $rank cpuset .*" "$out" | head -n 1)
    n=$(count_cpus "${set_line#rank $rank }")
    [[ $n == "$cpus" ]] || fail "rank $rank: '$set_line': $n CPU(s) in its cpuset, expected $cpus"
  fi
done
cgroup=$([[ -e "$CLUSTER_DIR/cgroup.conf" ]] && echo " (affinity and cpuset)" || echo " (affinity)")
pass "bound$cgroup: a plain task 1 CPU, each worker of --cpus-per-task $cpus $cpus CPUs"
