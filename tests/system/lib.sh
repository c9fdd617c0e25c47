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
  dlrun_failed=1
  echo "FAIL ($test_name): $*" >&2
  for f in "$work"/*.out; do
    [[ -e "$f" ]] || continue
    # How ranks ended and why the agents restarted, from anywhere in the output (a long job's
    # tail alone can miss the first run of a requeued one).
    echo "--- $f (warnings, errors, deaths and restarts)" >&2
    grep -n -E "warning|error|died|restart [0-9]+:|hung|FAIL" "$f" | head -n 40 >&2 || true
    echo "--- $f (last 60 lines)" >&2
    tail -n 60 "$f" >&2
  done
  exit 1
}

pass() { echo "PASS ($test_name): $*"; }

# A command that ends the test through errexit says which, with the jobs' output, as fail does.
trap 'rc=$?; fail "line $LINENO: exit $rc of: $BASH_COMMAND"' ERR

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# wait_for_line FILE REGEX SECONDS: blocks until a line of FILE matches, or fails the test.
wait_for_line() {
  follow_until "$@" || fail "no line matching '$2' in $1 within $3 s"
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
