# Helpers shared by the system tests (tests/system/*.sh) and bench/chaos (sourced).

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
