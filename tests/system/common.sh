# Helpers shared by the system tests (tests/system/*.sh) and bench/chaos (sourced).

# Every system test that ends non-zero says so: a FAIL line naming the exit status and the
# command that ended it, with the last lines of the test's logs, even when no check of its own
# spoke (an errexit inside a function or a command substitution, a signal, a `set -u` slip). A
# test's own failure message sets dlrun_failed (fail, fail_with_dlrun_lines), so it is not said
# twice. Clean-ups go through on_exit CMD (run in order after that line), never `trap ... EXIT`,
# which would replace this one.
dlrun_failed=""
dlrun_exit_cmds=()
on_exit() { dlrun_exit_cmds+=("$1"); }
_dlrun_at_exit() {
  local rc=$? cmd=$BASH_COMMAND c f
  if ((rc != 0)) && [[ -z "$dlrun_failed" ]]; then
    echo "FAIL (${test_name:-$(basename "$0" .sh)}): ended with exit $rc, the last command: $cmd" >&2
    for f in "${work:-/nonexistent}"/*.log "${work:-/nonexistent}"/*.out; do
      [[ -e "$f" ]] && { echo "--- $f (last 30 lines)" >&2; tail -n 30 "$f" >&2; }
    done
  fi
  for c in "${dlrun_exit_cmds[@]}"; do eval "$c" || true; done
  exit "$rc"
}
trap _dlrun_at_exit EXIT

# A port the kernel reports free on 127.0.0.1 now.
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# follow_until FILE REGEX SECONDS [FROM_LINE]: returns 0 as soon as a line of FILE (which may not
# exist yet), from line FROM_LINE on (default 1), matches, 1 after SECONDS without one. grep stops
# at the first match; the follower is bounded by timeout and killed right after.
follow_until() {
  local found=1 fifo pid
  fifo=$(mktemp -u "${TMPDIR:-/tmp}/dlrun-follow.XXXXXX")
  mkfifo "$fifo"
  timeout "$3" tail -n "+${4:-1}" -F "$1" >"$fifo" 2>/dev/null &
  pid=$!
  grep -q -m1 -E "$2" <"$fifo" && found=0
  kill "$pid" 2>/dev/null || true
  rm -f "$fifo"
  return $found
}

# fail_with_dlrun_lines NAME MESSAGE FILE...: "FAIL (NAME): MESSAGE", then the last 30 of each
# FILE's lines that are dlrun's own (not a rank's), and exit 1.
fail_with_dlrun_lines() {
  local name=$1 msg=$2 f
  shift 2
  dlrun_failed=1
  echo "FAIL ($name): $msg" >&2
  for f in "$@"; do
    [[ -e "$f" ]] && { echo "--- $f (dlrun lines)" >&2; grep -v '^\[rank' "$f" | tail -n 30 >&2; }
  done
  exit 1
}

# first_pids LOG: the pids of the first rank table an agent printed in LOG.
first_pids() { awk '/local_rank  rank  pid/ {t=1; next} t && NF==3 {print $3; next} {t=0}' "$1"; }

# netns_pair TAG: two network namespaces joined by a veth pair, each with its own address on a
# fresh /24 and its loopback up; sets ns_a ns_b addr_a addr_b link_a link_b. netns_pair_down
# kills what runs in them and deletes them (an EXIT trap's job). Needs root and iproute2.
netns_pair() {
  command -v ip >/dev/null || { echo "FAIL: ip (iproute2) is missing" >&2; return 1; }
  ns_a="dlrun-$1-$$-a"
  ns_b="dlrun-$1-$$-b"
  link_a="v$1a$$"  # interface names: at most 15 characters
  link_b="v$1b$$"
  local net="10.$((RANDOM % 200 + 20)).$((RANDOM % 250))" ns
  addr_a="$net.1"
  addr_b="$net.2"
  ip netns add "$ns_a"
  ip netns add "$ns_b"
  ip link add "$link_a" netns "$ns_a" type veth peer name "$link_b" netns "$ns_b"
  ip -n "$ns_a" addr add "$addr_a/24" dev "$link_a"
  ip -n "$ns_b" addr add "$addr_b/24" dev "$link_b"
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
  ip -n "$ns_a" link set "$link_a" up
  ip -n "$ns_b" link set "$link_b" up
}
netns_pair_down() {
  local ns p
  for ns in "${ns_a:-}" "${ns_b:-}"; do
    [[ -n "$ns" ]] || continue  # an EXIT trap set before the pair was made
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
