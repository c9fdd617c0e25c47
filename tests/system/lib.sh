# Shared helpers of the Slurm / MPI system tests (sourced). Each test gets:
#   DLRUN, TRAIN_UNET, MAKE_UNET_DATA   built binaries (from the environment ctest sets)
#   CLUSTER_DIR                        the cluster started by cluster.sh (fixture slurm_cluster)
#   work                               a fresh directory for this test (not under /tmp: the
#                                      "nodes" have private /tmp directories)
set -euo pipefail

: "${DLRUN:?}" "${TRAIN_UNET:?}" "${MAKE_UNET_DATA:?}" "${CLUSTER_DIR:?}"
export SLURM_CONF="$CLUSTER_DIR/slurm.conf"
test_name=$(basename "$0" .sh)
work="$CLUSTER_DIR/jobs/$test_name.$$"
rm -rf "$work"
mkdir -p "$work"
cd "$work"

fail() {
  echo "FAIL ($test_name): $*" >&2
  for f in "$work"/*.out; do
    [[ -e "$f" ]] && { echo "--- $f (last 60 lines)" >&2; tail -n 60 "$f" >&2; }
  done
  exit 1
}

pass() { echo "PASS ($test_name): $*"; }

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_for_line FILE REGEX SECONDS: blocks until a line of FILE (which may not exist yet)
# matches, or fails after SECONDS.
wait_for_line() {
  local found=0 fifo="$work/.follow.$RANDOM" pid
  mkfifo "$fifo"
  # grep stops at the first match; the follower is bounded by timeout and killed right after.
  timeout "$3" tail -n +1 -F "$1" >"$fifo" 2>/dev/null &
  pid=$!
  grep -q -m1 -E "$2" <"$fifo" && found=1
  kill "$pid" 2>/dev/null || true
  rm -f "$fifo"
  ((found)) || fail "no line matching '$2' in $1 within $3 s"
}

# submit SCRIPT SECONDS: sbatch --wait in the background; sets jid (and out, the job's output
# file). finish: waits for that sbatch, which returns when the job has ended for good (after
# any requeue), with the job's success or failure.
submit() {
  timeout "$2" sbatch --wait --parsable "$1" >"$work/submit.out" 2>"$work/submit.err" &
  submit_pid=$!
  wait_for_line "$work/submit.out" "^[0-9]+" 30
  jid=$(head -n 1 "$work/submit.out" | cut -d';' -f1)
  out="dlrun-$jid.out"
}
finish() {
  local rc=0
  wait "$submit_pid" || rc=$?
  ((rc == 0)) || fail "job $jid did not succeed (sbatch --wait: $rc; $(cat "$work/submit.err"))"
}

# count LINE_REGEX FILE: how many lines match.
count() { grep -c -E "$1" "$2" || true; }

# The rank table lines "  <local_rank>  <rank>  <pid>" the agents print, as sorted ranks.
ranks_in_tables() {
  awk '/local_rank  rank  pid/ {t=1; next} t && NF==3 && $1 ~ /^[0-9]+$/ {print $2; next} {t=0}' "$1" | sort -n | tr '\n' ' '
}
