#!/bin/sh
# A stand-in for NVIDIA's nsys (which cannot be installed here) for dlrun's --profile nsys test:
# appends "RANK=R DLRUN_PROFILE_STEPS=S ARGS..." to $NSYS_STUB_LOG, writes the -o report file as
# nsys would (STEM.nsys-rep), then runs the command after "--".
out=""
log_line="RANK=$RANK DLRUN_PROFILE_STEPS=${DLRUN_PROFILE_STEPS:-}"
prev=""
for a in "$@"; do
  log_line="$log_line $a"
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
echo "$log_line" >> "$NSYS_STUB_LOG"
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
[ -n "$out" ] && echo "stub report" > "$out.nsys-rep"
exec "$@"
