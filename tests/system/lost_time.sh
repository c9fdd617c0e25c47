#!/usr/bin/env bash
# The restart ledger on a host loss: an elastic 2-node job (`dlrun slurm --nodes 2 --min-nodes
# 1`) of tests/python/lost_time_train.py (gloo, a checkpoint every 10 steps, a line per step
# with its wall-clock begin and end) whose agent hosting the rendezvous is SIGKILLed a few steps
# past the checkpoint of step 10. The survivor takes over and resumes from step 10. Its report
# must give the restart's phases, summing to the time from the kill to the first step past the
# fault's step (measured here, from the program's own clock) within 10% (and 0.25 s: the ledger
# and the program read the clock at different points of a step); the steps computed again must be
# the ones between the checkpoint and the fault, their time the program's own for them; and Slurm
# must record COMPLETED. Nothing here bounds how fast this machine is: a warm spare starts a worker
# in 0.03 s, a loaded machine takes 0.3 s a step where the program sleeps 0.1 s. The program
# sleeps 0.25 s a step: from the "step 13 began" the kill waits for to the checkpoint of step 20
# is 1.75 s, room for the follower and `ss` on a loaded machine (with 0.1 s it was 0.7 s, and a
# CI run beside the whole suite killed after step 20's checkpoint: "resumed from step 20").
source "$(dirname "$0")/lib.sh"
: "${TEST_PYTHON:?}"

cp "$SOURCE_DIR/tests/python/lost_time_train.py" train.py
port=$(free_port)
"$DLRUN" slurm --nodes 2 --min-nodes 1 --nproc-per-node 2 --time 10 --rdzv-port "$port" \
  -o job.sbatch -- "$TEST_PYTHON" "$work/train.py" 40 10 "$work/ckpt" 0.25 2>/dev/null
submit job.sbatch 300
wait_for_line "$out" "checkpoint saved at step 10" 180
wait_for_line "$out" "step 13 began" 60

host_agent=$(ss -Hltnp "sport = :$port" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2)
[[ -n "$host_agent" ]] || fail "nobody listens on the rendezvous port $port"
kill_at=$(date +%s.%N)
kill -KILL "$host_agent"
echo "killed the hosting agent, pid $host_agent, at $kill_at"
finish
state=$(scontrol show job "$jid" | grep -o -E "JobState=[A-Z_]+|ExitCode=[0-9]+:[0-9]+" | tr '\n' ' ')
[[ "$state" == *"JobState=COMPLETED"* && "$state" == *"ExitCode=0:0"* ]] \
  || fail "Slurm recorded '$state' for a finished job (expected JobState=COMPLETED ExitCode=0:0)"

# The job's progress before the fault: the highest step any rank printed before the resume.
resume_line=$(grep -n -m1 "resumed from step" "$out" | cut -d: -f1)
[[ -n "$resume_line" ]] || fail "no resume"
resumed=$(sed -n "${resume_line}s/.*resumed from step \([0-9]*\).*/\1/p" "$out")
((resumed == 10)) || fail "resumed from step $resumed (expected the checkpoint of step 10)"
fault_step=$(head -n "$resume_line" "$out" | sed -n 's/.*step \([0-9]*\) began.*/\1/p' | sort -n | tail -n 1)
# The first step past it, after the resume: where the job made progress again.
# (awk reads the file itself: a reader that exits early would end a writer of a pipe with SIGPIPE,
# and pipefail would end the test without a word.)
next_began=$(awk -v f="$fault_step" -v from="$resume_line" 'NR >= from && found == "" && /step [0-9]+ began/ {
  for (i = 1; i < NF; i++) if ($i == "step" && $(i+1) > f) { found = $(i+3); break } }
  END { print found }' "$out")
[[ -n "$next_began" ]] || fail "no step past $fault_step after the resume"
# The program's own time for the steps computed again: from the first of them to that next step.
first_again=$(awk -v s="$((resumed + 1))" -v from="$resume_line" 'NR >= from && found == "" && /step [0-9]+ began/ {
  for (i = 1; i < NF; i++) if ($i == "step" && $(i+1) == s) { found = $(i+3); break } }
  END { print found }' "$out")
[[ -n "$first_again" ]] || fail "no step $((resumed + 1)) after the resume"

# restart 1: <cause>; T s lost (on H): detection a, stop b, rendezvous c, start d, checkpoint
# load e, N step(s) recomputed f (resumed from step R)
line=$(grep -m1 -E "^  restart 1: .* s lost \(on " "$out") || fail "the report has no cost for restart 1"
echo "$line"
grep -q "goodput [0-9]*%" "$out" || fail "the report has no goodput"
# (how the processes started, "start d (2 forked)", is left out first: sed has nine groups)
read -r total detection stop rdzv start load steps recomputed r_step < <(sed -E \
  -e 's/(start [0-9.]+) \([^)]*\)/\1/' -e \
  's/.*; ([0-9.]+) s lost \(on [^)]*\): detection ([0-9.]+), stop ([0-9.]+), rendezvous ([0-9.]+), start ([0-9.]+), checkpoint load ([0-9.]+), ([0-9]+) step\(s\) recomputed ([0-9.]+) \(resumed from step ([0-9]+)\).*/\1 \2 \3 \4 \5 \6 \7 \8 \9/' <<<"$line")
[[ "$r_step" == "$resumed" ]] || fail "the ledger says resumed from step '$r_step', the program $resumed"
((steps == fault_step - resumed)) ||
  fail "the ledger counts $steps step(s) recomputed; the program ran $((resumed + 1))-$fault_step again"
/usr/bin/python3 - "$total" "$detection" "$stop" "$rdzv" "$start" "$load" "$recomputed" \
  "$kill_at" "$next_began" "$first_again" <<'EOF' || fail "the ledger does not add up (above)"
import sys
total, det, stop, rdzv, start, load, recomputed, kill_at, next_began, first_again = map(
    float, sys.argv[1:11])
measured = next_began - kill_at
again = next_began - first_again
parts = det + stop + rdzv + start + load + recomputed
print(f"ledger {total:.2f} s = {parts:.2f} s of phases; the program: {measured:.2f} s from the kill "
      f"to the first new step; recomputed {recomputed:.2f} s, the program's {again:.2f} s")
checks = {
    "the phases sum to the total (two decimals each)": abs(parts - total) <= 0.03,
    "the total is the program's loss": abs(total - measured) <= 0.1 * measured + 0.25,
    "no phase is negative": min(det, stop, rdzv, start, load, recomputed) >= 0,
    "the recomputed steps took the program's time": abs(recomputed - again) <= 0.1 * again + 0.25,
}
for name, ok in checks.items():
    if not ok:
        print(f"broken: {name}")
sys.exit(0 if all(checks.values()) else 1)
EOF
pass "host loss after step $fault_step, resumed from $resumed: $line"
